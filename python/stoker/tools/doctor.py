"""``stoker doctor``: what this machine is short of, for multi-process data loading.

Each check says ok / warn / fail, what it found, and what to do. ``--json`` for scripts; the
exit code is 1 when a check fails. ``--clean-stale-shm`` deletes the /dev/shm/torch_* files whose
owning process is gone (never a live one) and reports the bytes freed. ``--sample-mb`` sizes the
num_workers / prefetch_factor advice.

A command: one thread; it reads the machine and changes nothing (but ``--clean-stale-shm``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import sys

from ..common import advice as _advice
from ..common import system as _system

SHM = "/dev/shm"
_TORCH_SHM = re.compile(r"^torch_(\d+)_")


def _check(name, status, detail, advice=""):
    return {"check": name, "status": status, "detail": detail, "advice": advice}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def stale_torch_shm(shm_dir: str = SHM) -> list[dict]:
    """torch_<pid>_* files in /dev/shm whose owner process no longer exists."""
    out = []
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return out
    for name in names:
        m = _TORCH_SHM.match(name)
        if not m or _alive(int(m.group(1))):
            continue
        path = os.path.join(shm_dir, name)
        try:
            size = os.stat(path).st_blocks * 512
        except OSError:
            continue
        out.append({"path": path, "owner_pid": int(m.group(1)), "bytes": size})
    return out


def clean_stale_shm(shm_dir: str = SHM) -> tuple[int, int]:
    """Deletes stale torch_* files; returns (files, bytes) freed."""
    files = freed = 0
    for f in stale_torch_shm(shm_dir):
        m = _TORCH_SHM.match(os.path.basename(f["path"]))
        if m and _alive(int(m.group(1))):  # re-check just before deleting
            continue
        try:
            os.unlink(f["path"])
            files += 1
            freed += f["bytes"]
        except OSError:
            pass
    return files, freed


def usable_cpus() -> tuple[int, float | None]:
    """(CPUs in the affinity mask, the cgroup CPU quota in CPUs or None)."""
    return len(os.sched_getaffinity(0)), _system.cpu_quota()


def loaders_on_this_machine() -> list[dict]:
    """The stoker loaders of this user running on this machine (``stoker top``'s view): per
    main process, its pid and its live workers."""
    from . import top

    out: dict[int, dict] = {}
    for loader in top.snapshot():
        entry = out.setdefault(loader["pid"], {"pid": loader["pid"], "workers": set(),
                                               "pool": False})
        entry["workers"].update(w["pid"] for w in loader["workers"] if w["pid"])
        # the node's pool: workers serving the ranks' loaders, but no training loop of its own
        entry["pool"] = loader["served_by"].startswith("stoker node pool")
    return [{"pid": e["pid"], "workers": len(e["workers"]), "pool": e["pool"]}
            for e in out.values()]


def _cpu_seconds(pid) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


# a loader's workers are judged once they were busy this long (less is start-up)
MIN_BUSY_S = 2.0


def waiting_or_computing(snapshot: list[dict]) -> dict:
    """The check that tells, per running loader, whether its workers wait or compute: their CPU
    seconds and the seconds their threads waited for a CPU (/proc: runnable, on the run queue,
    which is computing) against the seconds their status pages say they were busy (loading,
    collating, encoding). Workers that mostly wait need threads_per_worker, not more workers;
    workers that compute but wait long for a CPU find the machine's CPUs taken."""
    waiting, crowded, judged = [], [], 0
    for ld in snapshot:
        cpu = busy = loading = queued = 0.0
        for w in ld["workers"]:
            c = _cpu_seconds(w["pid"])
            if c is None:
                continue
            s = w["seconds"]
            # (what it spent starting, before it was ready, is not work: status page; a local
            # worker not ready yet has None there and counts nothing)
            ready_cpu = w.get("ready_cpu_seconds", 0.0)
            if ready_cpu is None:
                continue
            cpu += max(0.0, c - ready_cpu)
            queued += max(0.0, (_system.runqueue_seconds(w["pid"]) or 0.0)
                          - (w.get("ready_runqueue_seconds") or 0.0))
            busy += s["loading"] + s["collating"] + s["encoding"]
            loading += s["loading"]
        if busy < MIN_BUSY_S:
            continue
        judged += 1
        if loading >= busy / 2 and _advice.waiting(cpu, busy, queued):
            waiting.append((ld["pid"], cpu, busy))
        elif _advice.crowded(queued, busy):
            crowded.append((ld["pid"], cpu, queued, busy))
    if waiting:
        pid, cpu, busy = waiting[0]
        return _check(
            "waiting or computing", "warn",
            ", ".join(f"loader pid {p}: workers on a CPU {100 * c / b:.0f}% of their busy time"
                      for p, c, b in waiting),
            _advice.raise_threads(cpu, busy))
    if crowded:
        pid, cpu, queued, busy = crowded[0]
        return _check(
            "waiting or computing", "warn",
            ", ".join(f"loader pid {p}: workers compute, and waited for a CPU "
                      f"{100 * q / b:.0f}% of their busy time" for p, c, q, b in crowded),
            _advice.cpus_taken(cpu, queued, busy))
    return _check("waiting or computing", "ok",
                  f"{judged} running loader(s) judged: their workers compute" if judged
                  else "no running loader's workers have been busy long enough to judge")


def workers_against_cpus(loaders: list[dict], cpus: int) -> dict:
    """The check that the loaders' workers on this machine, with one core for each training
    loop, fit its CPUs (ranks that each start a full set of workers do not)."""
    workers = sum(e["workers"] for e in loaders)
    loops = sum(1 for e in loaders if not e.get("pool"))
    need = workers + loops
    detail = (f"{loops} process(es) with stoker loaders run {workers} workers on "
              f"{cpus} CPUs")
    if loops < len(loaders):
        detail += " (with the node's pool)"
    if not loaders or need <= cpus:
        return _check("workers on this machine", "ok", detail)
    return _check(
        "workers on this machine", "warn", detail + f": with a core for each training loop "
        f"that is {need} for {cpus}",
        "Workers fighting the training loops for cores slow training itself. Give each rank "
        "its share: num_workers=\"auto\" takes CPUs / LOCAL_WORLD_SIZE per rank under torchrun "
        "(or set num_workers to about that by hand).")


def orphan_workers() -> list[dict]:
    """Python processes adopted by init that look like data-loader workers (spawn/forkserver
    children, or processes holding stoker's shared memory)."""
    out = []
    me = os.getpid()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == me:
            continue
        try:
            stat = open(f"/proc/{pid}/stat").read()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(
                errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        if ppid != 1 or "python" not in cmd or "stoker.placements.node.pool" in cmd:
            continue  # (the node's pool detaches on purpose and ends with its job)
        if "multiprocessing" in cmd or "stoker-" in _maps(pid):
            out.append({"pid": int(pid), "command": cmd.strip()[:120]})
    return out


def _maps(pid: str) -> str:
    try:
        return open(f"/proc/{pid}/maps").read()
    except OSError:
        return ""


def run_checks(sample_mb: float = 1.0, shm_dir: str = SHM) -> list[dict]:
    checks = []
    # /dev/shm
    try:
        st = os.statvfs(shm_dir)
        size = st.f_blocks * st.f_frsize
        used = (st.f_blocks - st.f_bfree) * st.f_frsize
        pct = 100 * used / size if size else 100.0
        status = "fail" if pct > 90 else ("warn" if size < 1 << 30 else "ok")
        checks.append(_check(
            "/dev/shm", status,
            f"{_system.human_bytes(size)}, {pct:.0f}% used ({_system.human_bytes(used)})",
            "stoker does not use /dev/shm (its batches live in memfd slots). torch's DataLoader "
            "needs room there for every batch in flight: with less than 1 GiB expect 'Bus error'; "
            "raise it (docker run --shm-size=8g) or use stoker." if status != "ok" else ""))
    except OSError as e:
        checks.append(_check("/dev/shm", "warn", f"cannot read: {e}", ""))
    # stale torch segments
    stale = stale_torch_shm(shm_dir)
    if stale:
        total = sum(f["bytes"] for f in stale)
        listing = ", ".join(f"{os.path.basename(f['path'])} ({_system.human_bytes(f['bytes'])})"
                            for f in stale[:10])
        checks.append(_check(
            "stale torch shared memory", "warn",
            f"{len(stale)} /dev/shm/torch_* files whose process is gone hold "
            f"{_system.human_bytes(total)}: {listing}",
            "stoker doctor --clean-stale-shm deletes them (and only them)."))
    else:
        checks.append(_check("stale torch shared memory", "ok",
                             "no /dev/shm/torch_* file of a dead process"))
    # open files
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    status = "warn" if soft < 4096 else "ok"
    checks.append(_check(
        "open-file limit", status, f"soft {soft}, hard {hard}",
        "torch's DataLoader holds one descriptor per live tensor ('Too many open files'); "
        "stoker needs a few per worker. Raise it with `ulimit -n 65536` (up to the hard limit)."
        if status != "ok" else ""))
    # memory cgroup
    limit, usage = _system.memory_limit_and_usage()
    cg_ooms, kernel_ooms = _system.oom_kills()
    if limit:
        pct = 100 * (usage or 0) / limit
        status = "warn" if pct > 90 or (cg_ooms or 0) > 0 else "ok"
        checks.append(_check(
            "memory cgroup", status,
            f"limit {_system.human_bytes(limit)}, usage {_system.human_bytes(usage)} "
            f"({pct:.0f}%), OOM kills so far: {cg_ooms}",
            "Workers killed by SIGKILL here were most likely OOM kills: lower num_workers, "
            "prefetch_factor or batch_size." if status != "ok" else ""))
    else:
        checks.append(_check("memory cgroup", "ok",
                             f"no memory limit; kernel OOM kills so far: {kernel_ooms}"))
    # CPUs
    affinity, quota = usable_cpus()
    cpus = min(affinity, quota) if quota else affinity
    ranks = _system.local_ranks()
    checks.append(_check(
        "usable CPUs", "ok",
        f"{affinity} in the affinity mask" + (f", cgroup quota {quota:.1f}" if quota else "")
        + (f"; {ranks} ranks of this job on this machine, {_system.rank_cpus()} CPUs each"
           if ranks > 1 else ""),
        ""))
    checks.append(workers_against_cpus(loaders_on_this_machine(), _system.node_cpus()))
    # start method
    method = multiprocessing.get_start_method(allow_none=True) or \
        multiprocessing.get_context().get_start_method()
    checks.append(_check("default start method", "ok", method,
                         "fork is fastest but unsafe after CUDA or threads started; stoker "
                         "switches to forkserver when CUDA is initialised." if method == "fork"
                         else ""))
    # torch
    try:
        import torch

        strategy = torch.multiprocessing.get_sharing_strategy()
        cuda = torch.cuda.is_available()
        checks.append(_check("torch", "ok",
                             f"{torch.__version__}, sharing strategy '{strategy}', "
                             f"CUDA available: {cuda}",
                             ""))
        checks.append(_check(
            "fork with CUDA", "warn" if cuda and method == "fork" else "ok",
            "CUDA is available and the default start method is fork" if cuda and method == "fork"
            else "no CUDA or not fork",
            "A process that initialised CUDA must not fork workers; create loaders before "
            "touching CUDA or use multiprocessing_context='forkserver' (stoker does it for you)."
            if cuda and method == "fork" else ""))
    except ImportError:
        checks.append(_check("torch", "warn", "not installed", "pip install torch"))
    # on a free-threaded Python: the installed modules whose import turns the GIL back on
    from . import doctor_gil

    checks.append(doctor_gil.check())
    # workers that wait rather than compute (threads_per_worker)
    from . import top

    checks.append(waiting_or_computing(top.snapshot()))
    # leftovers
    orphans = orphan_workers()
    checks.append(_check(
        "leftover workers", "warn" if orphans else "ok",
        ", ".join(f"pid {o['pid']}" for o in orphans[:10]) if orphans else "none",
        "Processes adopted by init that look like data-loader workers: a training run died "
        "without reaping them. `kill` them if their job is gone." if orphans else ""))
    # advice
    workers = max(1, int(cpus) - 1)
    prefetch = 2 if sample_mb >= 1 else 4
    budget = f"{workers} x {prefetch} batches in flight"
    checks.append(_check(
        "recommendation", "ok",
        f"num_workers={workers}, prefetch_factor={prefetch} for ~{sample_mb:g} MB samples "
        f"({budget})",
        "One core stays with the training loop. Raise num_workers while loader.stats()"
        "['data_stall'] stays high and CPUs are idle; or let stoker.DataLoader tune both "
        "during the epoch: num_workers=\"auto\", prefetch_factor=\"auto\"."))
    return checks


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="stoker doctor", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--clean-stale-shm", action="store_true",
                    help="delete /dev/shm/torch_* files whose owning process is gone")
    ap.add_argument("--sample-mb", type=float, default=1.0, help="typical sample size, in MB")
    args = ap.parse_args(argv)
    report = {}
    if args.clean_stale_shm:
        files, freed = clean_stale_shm()
        report["cleaned"] = {"files": files, "bytes": freed}
        if not args.json:
            print(f"deleted {files} stale /dev/shm/torch_* file(s), "
                  f"freed {_system.human_bytes(freed)}")
    checks = run_checks(args.sample_mb)
    report["checks"] = checks
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        for c in checks:
            print(f"{c['status']:4}  {c['check']}: {c['detail']}")
            if c["advice"]:
                print(f"      -> {c['advice']}")
    return 1 if any(c["status"] == "fail" for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
