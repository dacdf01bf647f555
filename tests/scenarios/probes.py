"""What a scenario reads off its own process (from /proc) and the batches it got: its children,
whether a process still runs, its open descriptors and private memory, the labels a loader
delivered. Also imported by tests in the pytest process."""

from __future__ import annotations

import os


def children() -> list[int]:
    """The pids of this process's children, zombies included (a worker not reaped is a leak)."""
    me = str(os.getpid())
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[1] == me:
                        out.append(int(p))
            except OSError:
                pass
    return out


def _stat(pid) -> tuple[int, str] | None:
    """(parent pid, state letter) of process `pid`, None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[1]), fields[0]
    except (OSError, ValueError, IndexError):
        return None


def helpers() -> set[int]:
    """multiprocessing's lifelong helpers of this process, where it started them: the fork
    server (the forkserver start method, 3.14's default, starts one for the process and keeps it
    for every later start, stoker's workers and torch's alike) and the resource tracker (spawn
    and forkserver start it). Neither is a worker, and neither is a loader's to stop."""
    import multiprocessing.forkserver
    import multiprocessing.resource_tracker

    pids = {getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None),
            getattr(multiprocessing.resource_tracker._resource_tracker, "_pid", None)}
    return {p for p in pids if p}


def helpers_started() -> None:
    """Starts the helpers the default start method uses now, as the first loader would, so
    that what a scenario counts after its loaders (descriptors, processes) is compared with a
    count taken with them there (the fork server keeps two descriptors in this process, the
    tracker one)."""
    import multiprocessing
    import multiprocessing.forkserver
    import multiprocessing.resource_tracker

    method = multiprocessing.get_start_method()
    if method in ("spawn", "forkserver"):
        multiprocessing.resource_tracker.ensure_running()
    if method == "forkserver":
        multiprocessing.forkserver.ensure_running()


def leftovers() -> list[int]:
    """What this process's loaders left behind: its children, less multiprocessing's helpers
    (``helpers``), and the children of those helpers that still run (workers the fork server
    forked are its children, not ours). A child of ours that is a zombie counts (reaping it is
    the loader's job); one of the fork server's is for the fork server to reap."""
    skip = helpers()
    out = [c for c in children() if c not in skip]
    stats = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            st = _stat(p)
            if st is not None:
                stats[int(p)] = st
    out += [p for p, (ppid, state) in stats.items() if ppid in skip and state != "Z"]
    return sorted(out)


def alive(pid: int) -> bool:
    """Whether process `pid` runs: it exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def open_fds(pid="self") -> int:
    """How many descriptors process `pid` holds open."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def private_kb(pid="self") -> int:
    """Process `pid`'s private memory, clean and dirty, in KiB (from smaps_rollup)."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return sum(int(line.split()[1]) for line in f
                   if line.startswith(("Private_Dirty", "Private_Clean")))


def labels(batches) -> list[int]:
    """The labels (a batch's second field) of every sample in `batches`, sorted."""
    return sorted(int(x) for b in batches for x in b[1])
