"""What the kernel says about this machine and its processes: the one reader of ``/proc`` and
the cgroup tree.

- Memory: the memory cgroup this process runs in (v2 or v1), its limit and usage, the headroom
  left, and the OOM-kill counters. A worker killed by SIGKILL was, most often, chosen by the
  out-of-memory killer; dmesg is usually not readable in a container, so stoker compares OOM-kill
  counters read before and after the death: the memory cgroup's (v2 ``memory.events``, v1
  ``memory.oom_control``) and the kernel's (``/proc/vmstat``).
- CPUs: the affinity mask capped by the cgroup's CPU quota; how many ranks of a job share this
  machine (their launcher's variables) and one rank's share of its CPUs.
- A process: its state letter and its CPU seconds (``/proc/PID/stat``), its resident size
  (``/proc/PID/statm``), and the seconds its threads waited on a run queue, runnable but not
  running because every CPU it may use was taken (``/proc/PID/task/TID/schedstat``): waiting
  for a CPU is computing, not waiting for I/O.
- The interpreter: whether the GIL is on (``gil_enabled``).

Plain functions over files, safe from any thread. The roots are module variables so that tests
can point them at a fake tree.
"""

from __future__ import annotations

import math
import os
import sys

_V2_ROOT = "/sys/fs/cgroup"
_V1_ROOT = "/sys/fs/cgroup/memory"
_PROC = "/proc"  # the roots are variables so that tests can point them at a fake tree


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _keyed(text: str | None, key: str) -> int | None:
    if not text:
        return None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key:
            try:
                return int(parts[1])
            except ValueError:
                return None
    return None


def _up_to_root(d: str):
    """A v2 cgroup directory and its ancestors up to the root, nearest first."""
    p = d.rstrip("/")
    while p and p.startswith(_V2_ROOT):
        yield p
        if p == _V2_ROOT:
            break
        p = os.path.dirname(p)


def memory_cgroup_dir(pid: int | str = "self") -> tuple[str | None, int]:
    """(directory of the memory cgroup, version 1 or 2), or (None, 0)."""
    text = _read(f"{_PROC}/{pid}/cgroup") or ""
    for line in text.splitlines():
        hid, controllers, path = line.split(":", 2)
        if hid == "0" and controllers == "":
            d = os.path.join(_V2_ROOT, path.lstrip("/")).rstrip("/")
            if os.path.exists(os.path.join(d, "memory.events")):
                return d, 2
    for line in text.splitlines():
        hid, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            d = os.path.join(_V1_ROOT, path.lstrip("/"))
            if os.path.exists(d):
                return d, 1
    return None, 0


def oom_kills() -> tuple[int | None, int | None]:
    """(OOM kills recorded by this process's memory cgroup, OOM kills in the whole kernel)."""
    d, version = memory_cgroup_dir()
    cg = None
    if version == 2:
        cg = _keyed(_read(os.path.join(d, "memory.events")), "oom_kill")
    elif version == 1:
        cg = _keyed(_read(os.path.join(d, "memory.oom_control")), "oom_kill")
    return cg, _keyed(_read(f"{_PROC}/vmstat"), "oom_kill")


def memory_limit_and_usage() -> tuple[int | None, int | None]:
    """The tightest memory limit over this cgroup and its ancestors, and the usage, in bytes."""
    d, version = memory_cgroup_dir()
    if version == 2:
        limit = None
        for p in _up_to_root(d):
            v = (_read(os.path.join(p, "memory.max")) or "").strip()
            if v.isdigit():
                limit = int(v) if limit is None else min(limit, int(v))
        usage = (_read(os.path.join(d, "memory.current")) or "").strip()
        return limit, int(usage) if usage.isdigit() else None
    if version == 1:
        limit = (_read(os.path.join(d, "memory.limit_in_bytes")) or "").strip()
        usage = (_read(os.path.join(d, "memory.usage_in_bytes")) or "").strip()
        lim = int(limit) if limit.isdigit() and int(limit) < 2**60 else None
        return lim, int(usage) if usage.isdigit() else None
    return None, None


SHARED_MEMORY_FRACTION = 0.5


def default_shared_memory_cap() -> int | None:
    """max_shared_memory="auto": half the memory limit of this process's cgroup, so that batches
    held by the user end in an error that says so rather than an OOM kill; None (no cap) when
    no limit is set."""
    limit, _ = memory_limit_and_usage()
    return int(limit * SHARED_MEMORY_FRACTION) if limit else None


def human_bytes(n: int | None) -> str:
    if n is None:
        return "unknown"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _cpu_quota(text: str | None) -> float | None:
    """CPUs allowed by a v2 ``cpu.max`` ("quota period", or "max period")."""
    parts = (text or "").split()
    if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit() and int(parts[1]) > 0:
        return int(parts[0]) / int(parts[1])
    return None


def cpu_quota() -> float | None:
    """The CPUs this process's cgroup (and its ancestors) may use per second, from the CFS
    quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``/``cpu.cfs_period_us``); None without one."""
    text = _read(f"{_PROC}/self/cgroup") or ""
    quotas = []
    for line in text.splitlines():
        hid, controllers, path = line.split(":", 2)
        if hid == "0" and controllers == "":
            for p in _up_to_root(os.path.join(_V2_ROOT, path.lstrip("/"))):
                q = _cpu_quota(_read(os.path.join(p, "cpu.max")))
                if q is not None:
                    quotas.append(q)
        elif "cpu" in controllers.split(","):
            for name in ("cpu,cpuacct", "cpu", "cpuacct,cpu"):
                d = os.path.join(_V2_ROOT, name, path.lstrip("/"))
                quota = (_read(os.path.join(d, "cpu.cfs_quota_us")) or "").strip()
                period = (_read(os.path.join(d, "cpu.cfs_period_us")) or "").strip()
                if quota.isdigit() and period.isdigit() and int(period) > 0:
                    quotas.append(int(quota) / int(period))
                    break
    return min(quotas) if quotas else None


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity, capped by the cgroup's CPU quota (rounded
    up: a quota of 2.5 CPUs keeps 3 workers busy part of the time); at least 1."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    q = cpu_quota()
    if q is not None:
        n = min(n, max(1, math.ceil(q - 1e-9)))
    return max(1, n)


def cpu_list_count(text: str | None) -> int | None:
    """The CPUs in a kernel CPU list ("0-3,8,10-11"), None when it is empty or unreadable."""
    n = 0
    for part in (text or "").strip().split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            return None
        n += int(hi) - int(lo) + 1 if hi else 1
    return n or None


def node_cpus() -> int:
    """The CPUs of this machine that this process's cgroup may be given (its effective cpuset:
    a container's ``--cpuset-cpus``), else the online CPUs: what the ranks of a job on this
    machine share."""
    text = _read(f"{_PROC}/self/cgroup") or ""
    for line in text.splitlines():
        hid, controllers, path = line.split(":", 2)
        if hid == "0" and controllers == "":
            for p in _up_to_root(os.path.join(_V2_ROOT, path.lstrip("/"))):
                n = cpu_list_count(_read(os.path.join(p, "cpuset.cpus.effective")))
                if n:
                    return n
        elif "cpuset" in controllers.split(","):
            d = os.path.join(_V2_ROOT, "cpuset", path.lstrip("/"))
            n = cpu_list_count(_read(os.path.join(d, "cpuset.effective_cpus")))
            if n:
                return n
    return os.cpu_count() or 1


def _positive(name: str) -> int | None:
    v = os.environ.get(name, "").strip()
    return int(v) if v.isdigit() and int(v) > 0 else None


def _slurm_tasks_here() -> int | None:
    """This node's task count in a Slurm step: ``SLURM_STEP_TASKS_PER_NODE`` ("2(x3),1": one
    count per node of the step) at ``SLURM_NODEID``; only inside a step's task (``SLURM_LOCALID``
    set), not in a batch script that merely runs in an allocation."""
    if "SLURM_LOCALID" not in os.environ:
        return None
    counts = []
    for part in os.environ.get("SLURM_STEP_TASKS_PER_NODE", "").split(","):
        n, _, times = part.partition("(x")
        if not n.isdigit() or (times and not times.rstrip(")").isdigit()):
            return None
        counts += [int(n)] * (int(times.rstrip(")")) if times else 1)
    if not counts:
        return None
    if len(set(counts)) == 1:
        return counts[0]
    node = _positive("SLURM_NODEID") or 0
    return counts[node] if node < len(counts) else None


def local_ranks() -> int:
    """How many processes of this job train on this machine, as their launcher says:
    ``LOCAL_WORLD_SIZE`` (torchrun, and what runs under it: accelerate, Lightning, DeepSpeed),
    Open MPI's ``OMPI_COMM_WORLD_LOCAL_SIZE``, MPICH's ``MPI_LOCALNRANKS``, a Slurm step's tasks
    on this node; 1 when none says."""
    for name in ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"):
        n = _positive(name)
        if n is not None:
            return n
    return _slurm_tasks_here() or 1


def rank_cpus() -> int:
    """The CPUs this process's loader may take (``num_workers="auto"``, the tuner's budget): all
    of ``usable_cpus`` when it trains alone on this machine; with ``local_ranks`` R of them, its
    share: the machine's CPUs (``node_cpus``) over R, within its own affinity (a launcher that
    binds each rank to its cores, or a NUMA node to several ranks, gives each the same share),
    and the cgroup's quota over R (the ranks of a container share it); at least 1. A job whose
    ranks were all bound to one set smaller than the machine (``taskset`` around the launcher)
    is not told apart from ranks bound one set each: num_workers=N says what it should be."""
    ranks = local_ranks()
    if ranks <= 1:
        return usable_cpus()
    try:
        mine = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        mine = os.cpu_count() or 1
    share = min(mine, node_cpus() // ranks)
    q = cpu_quota()
    if q is not None:
        share = min(share, math.ceil(q / ranks - 1e-9))
    return max(1, share)


def memory_headroom() -> tuple[int | None, int | None]:
    """(bytes that may still be used before the limit, the limit): the cgroup's limit less its
    usage, or the machine's MemAvailable and MemTotal without a cgroup limit."""
    limit, usage = memory_limit_and_usage()
    if limit is not None and usage is not None:
        return max(0, limit - usage), limit
    info = _read(f"{_PROC}/meminfo") or ""
    avail = _keyed_kb(info, "MemAvailable:")
    total = _keyed_kb(info, "MemTotal:")
    return avail, total


def _stat_fields(pid) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (which may hold spaces and
    parentheses): field 3 of proc(5) is ``[0]``."""
    try:
        with open(f"{_PROC}/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_state(pid) -> str:
    """The one-letter state of `pid` (R, S, D, T, t, Z...), '' when unknown."""
    fields = _stat_fields(pid) if pid is not None else None
    return fields[0] if fields else ""


def is_stopped(pid) -> bool:
    """The kernel says `pid` is stopped (SIGSTOP, a debugger, a cgroup freezer)."""
    return process_state(pid) in ("T", "t")


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid) -> float:
    """utime + stime of `pid` in seconds (0 when it is gone)."""
    fields = _stat_fields(pid) if pid is not None else None
    try:
        return (int(fields[11]) + int(fields[12])) / _TICKS
    except (TypeError, IndexError, ValueError):
        return 0.0


def stopped_and_cpu(pid) -> tuple[bool, float]:
    """(`pid` is stopped, its CPU seconds) from one read of ``/proc/PID/stat`` ((False, 0.0)
    when it is gone)."""
    fields = _stat_fields(pid) if pid is not None else None
    if not fields:
        return False, 0.0
    try:
        cpu = (int(fields[11]) + int(fields[12])) / _TICKS
    except (IndexError, ValueError):
        cpu = 0.0
    return fields[0] in ("T", "t"), cpu


def schedstat_ns(text) -> tuple[int, int] | None:
    """The first two fields of a ``schedstat`` line ("ns on a CPU, ns waiting on a run queue,
    timeslices"), None when it is not one (an empty read, a kernel that says nothing)."""
    if isinstance(text, bytes):
        text = text.decode("ascii", "replace")
    parts = (text or "").split()
    if len(parts) < 2 or not (parts[0].isdigit() and parts[1].isdigit()):
        return None
    return int(parts[0]), int(parts[1])


def runqueue_ns(text) -> int | None:
    """The second field of a ``schedstat`` line (``schedstat_ns``), None when it is not one."""
    both = schedstat_ns(text)
    return both[1] if both is not None else None


def thread_schedstat_ns(pid="self") -> dict[int, tuple[int, int]] | None:
    """(ns on a CPU, ns waiting on a run queue) of each thread of `pid` (this process by default)
    since it started, by thread id; None when the kernel does not say (no ``schedstat``: a kernel
    built without ``CONFIG_SCHED_INFO``) or `pid` is gone. A thread that ends while it is read is
    left out. One ``listdir`` and one small read per thread: cheap enough for every batch of a
    worker (about 5 us a thread)."""
    try:
        tids = os.listdir(f"{_PROC}/{pid}/task")
    except OSError:
        return None
    out = {}
    for tid in tids:
        try:
            fd = os.open(f"{_PROC}/{pid}/task/{tid}/schedstat", os.O_RDONLY)
        except OSError:
            continue  # (it ended since the listing, or there is no such file)
        try:
            both = schedstat_ns(os.read(fd, 128))
        except OSError:
            both = None  # (it ended between the open and the read: ESRCH)
        finally:
            os.close(fd)
        if both is not None and tid.isdigit():
            out[int(tid)] = both
    return out or None


def thread_runqueue_ns(pid="self") -> dict[int, int] | None:
    """Nanoseconds each thread of `pid` waited on a run queue (``thread_schedstat_ns``)."""
    per_thread = thread_schedstat_ns(pid)
    return {t: both[1] for t, both in per_thread.items()} if per_thread is not None else None


def schedstat_seconds(pid="self") -> tuple[float, float] | None:
    """(seconds on a CPU, seconds waiting on a run queue) of the live threads of `pid` (this
    process by default), None when the kernel does not say. To the nanosecond (``/proc/PID/stat``
    counts CPU in ticks: 10 ms). A sum over the threads now: what a thread that ended used is
    not in it (so a difference of two readings is clamped at 0 by its users)."""
    per_thread = thread_schedstat_ns(pid)
    if per_thread is None:
        return None
    return (sum(b[0] for b in per_thread.values()) / 1e9,
            sum(b[1] for b in per_thread.values()) / 1e9)


def runqueue_seconds(pid="self") -> float | None:
    """Seconds the live threads of `pid` (this process by default) waited on a run queue, None
    when the kernel does not say (``schedstat_seconds``)."""
    both = schedstat_seconds(pid)
    return both[1] if both is not None else None


def spent_so_far() -> tuple[float, float]:
    """(CPU seconds, run-queue seconds) of this process now, read as a reader of
    ``/proc/PID`` in another process reads them (``cpu_seconds``, ``runqueue_seconds``): what a
    worker spent starting, which its readers subtract."""
    return cpu_seconds(os.getpid()), runqueue_seconds() or 0.0


def gil_enabled() -> bool:
    """Whether this interpreter runs Python one thread at a time: True on a build with the GIL,
    and on a free-threaded build (3.13t, 3.14t) where the GIL was turned back on (``PYTHON_GIL=1``,
    or an extension that did not declare it can run without it)."""
    return bool(getattr(sys, "_is_gil_enabled", lambda: True)())


def resident_bytes(pid="self") -> int:
    """The resident set size of `pid` (this process by default), 0 when unknown."""
    text = _read(f"{_PROC}/{pid}/statm")
    try:
        return int(text.split()[1]) * _PAGE
    except (AttributeError, IndexError, ValueError):
        return 0


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _keyed_kb(text: str, key: str) -> int | None:
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == key and parts[1].isdigit():
            return int(parts[1]) * 1024
    return None


def mapped_file(address: int) -> tuple[int, int] | None:
    """(device, inode) of the file mapped at `address` in this process (``/proc/self/maps``),
    None when nothing or no file is mapped there."""
    text = _read(f"{_PROC}/self/maps")
    for line in (text or "").splitlines():
        parts = line.split(None, 5)
        if len(parts) < 5:
            continue
        start, _, end = parts[0].partition("-")
        try:
            if not int(start, 16) <= address < int(end, 16):
                continue
            major, minor = (int(x, 16) for x in parts[3].split(":"))
            inode = int(parts[4])
        except ValueError:
            return None
        return (os.makedev(major, minor), inode) if inode else None
    return None
