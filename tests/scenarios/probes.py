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
