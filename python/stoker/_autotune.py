"""num_workers="auto": how many workers take tasks, decided during the epoch from what the
iterator measures.

The loader is built with ``num_workers`` = the bound (the usable CPUs); the iterator starts
``initial`` of them and sends tasks to the first ``active`` workers only. Every ``WINDOW_S``
the ``Tuner`` looks at the last window:

- the loop waited for data (stall share above ``ADD_STALL``) and a core is free (the main process
  and the active workers together used less than usable CPUs - ``FREE_CORE``) and the memory
  budget has room for one more worker (its RSS and its share of the slots, against the cgroup's
  limit or the machine's available memory): one more worker;
- the loop hardly waited (below ``RETIRE_STALL``) and the active workers' busy time would fit in
  one worker fewer with room to spare, two windows in a row: one worker fewer (it keeps its
  process, idle, and is the first one added back).

Which worker loads a task does not change which samples are delivered nor their order (tasks
are numbered in the sampler's order and yielded in that order); with ``seed="per_sample"`` the
values do not change either. An IterableDataset is not tuned: each worker yields its own shard,
so all ``num_workers`` workers run.

``Tuner`` is plain arithmetic on numbers it is given (unit-tested with synthetic ones);
``Measure`` reads them from the iterator's statistics, the status pages and /proc.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

from . import _cgroup

log = logging.getLogger("stoker")

WINDOW_S = 0.25  # the tuner looks this often (and after at least one batch)
ADD_STALL = 0.05  # add a worker when the loop waited more than this share of the window
RETIRE_STALL = 0.01  # retire one only when the loop waited less than this
FREE_CORE = 0.75  # a core is free when this much CPU is left over
RETIRE_FIT = 0.7  # retire when the busy time fits in k-1 workers at most this busy
MEMORY_MARGIN = 0.1  # keep this share of the memory limit free
KEEP_DECISIONS = 20


def resolve_num_workers(value) -> int:
    """The bound for num_workers="auto": the usable CPUs (affinity, cgroup quota)."""
    if value == "auto":
        return _cgroup.usable_cpus()
    return value


@dataclass
class Window:
    """What happened during one window (seconds are wall-clock seconds of that window)."""

    seconds: float  # the window's length
    waited_s: float  # the loop waited for data this long
    main_cpu_s: float  # CPU the main process used (all its threads)
    worker_cpu_s: float  # CPU the active workers used
    worker_busy_s: float  # time the active workers spent loading, collating or encoding
    usable_cpus: int
    worker_rss: int  # the largest RSS of a worker (bytes), 0 when unknown
    slot_bytes_per_worker: int  # shared-memory slots mapped, per started worker
    memory_headroom: int | None  # bytes left before the limit (None: unknown)
    memory_limit: int | None


@dataclass
class Decision:
    batch: int
    active: int
    reason: str


class Tuner:
    def __init__(self, bound: int, initial: int | None = None):
        self.bound = max(1, bound)
        self.active = initial if initial is not None else max(1, self.bound // 2)
        self.active = min(self.bound, max(1, self.active))
        self.reason = f"started {self.active} of at most {self.bound} workers"
        self.decisions: list[Decision] = [Decision(0, self.active, self.reason)]
        self.settled_at: int | None = None  # the batch of the last change
        self._quiet_windows = 0
        self._skip_next = False

    def decide(self, w: Window, batch: int) -> int:
        """The number of active workers after window `w` (seen at batch `batch`)."""
        if self._skip_next:  # the window straddles the last change: it says little
            self._skip_next = False
            return self.active
        if w.seconds <= 0:
            return self.active
        stall = w.waited_s / w.seconds
        used = (w.main_cpu_s + w.worker_cpu_s) / w.seconds
        free = w.usable_cpus - used
        if stall > ADD_STALL:
            self._quiet_windows = 0
            if self.active >= self.bound:
                return self.active
            if free < FREE_CORE:
                return self.active
            need = w.worker_rss + w.slot_bytes_per_worker
            if w.memory_headroom is not None and w.memory_limit:
                if w.memory_headroom - need < MEMORY_MARGIN * w.memory_limit:
                    self._note(batch, self.active, (
                        f"not adding a worker: the loop waited {100 * stall:.0f}% of the time, "
                        f"but one more (~{_cgroup.human_bytes(need)}) would leave less than "
                        f"{100 * MEMORY_MARGIN:.0f}% of the memory limit "
                        f"({_cgroup.human_bytes(w.memory_limit)}) free"), change=False)
                    return self.active
            return self._change(batch, self.active + 1, (
                f"the loop waited for data {100 * stall:.0f}% of the time and "
                f"{free:.1f} of {w.usable_cpus} CPUs were free"))
        if stall < RETIRE_STALL and self.active > 1:
            per_worker = w.worker_busy_s / w.seconds / (self.active - 1)
            if per_worker < RETIRE_FIT:
                self._quiet_windows += 1
                if self._quiet_windows >= 2:
                    self._quiet_windows = 0
                    return self._change(batch, self.active - 1, (
                        f"the loop waited {100 * stall:.1f}% of the time and the workers were "
                        f"busy {w.worker_busy_s / w.seconds:.1f} worker-seconds per second: "
                        f"{self.active - 1} suffice"))
                return self.active
        self._quiet_windows = 0
        return self.active

    def _change(self, batch: int, active: int, reason: str) -> int:
        self._note(batch, active, f"{self.active} -> {active} workers: {reason}")
        self.active = active
        self.settled_at = batch
        self._skip_next = True
        return active

    def _note(self, batch, active, reason, change=True) -> None:
        if not change and self.reason == reason:
            return
        self.reason = reason
        self.decisions.append(Decision(batch, active, reason))
        del self.decisions[:-KEEP_DECISIONS]
        log.info("stoker: num_workers='auto': %s (at batch %d)", reason, batch)

    def snapshot(self) -> dict:
        return {
            "active_workers": self.active,
            "max_workers": self.bound,
            "reason": self.reason,
            "last_change_at_batch": self.settled_at,
            "decisions": [{"batch": d.batch, "active": d.active, "reason": d.reason}
                          for d in self.decisions],
        }


def _proc_cpu_s(pid) -> float:
    """utime + stime of `pid` in seconds (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS
    except (OSError, IndexError, ValueError):
        return 0.0


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class Measure:
    """Reads one window's numbers from the iterator's parts (main thread only)."""

    def __init__(self, stats, workers, usable_cpus: int):
        self._stats = stats
        self._workers = workers
        self._cpus = usable_cpus
        self._last = None

    def _now(self, active: int):
        busy = 0.0
        cpu = 0.0
        rss = 0
        for w in range(active):
            st = self._workers.status(w)
            if st:
                s = st["seconds_in"]
                busy += s["loading"] + s["collating"] + s["encoding"]
                rss = max(rss, st["rss_bytes"])
            pid = self._workers.pid(w)
            if pid is not None:
                cpu += _proc_cpu_s(pid)
        return (time.monotonic(), self._stats.waited_s, time.process_time(), cpu, busy, rss)

    def restart(self, active: int) -> None:
        """Starts a window (after a change: the new worker's counters start from here)."""
        self._last = self._now(active)

    def due(self) -> bool:
        return self._last is None or time.monotonic() - self._last[0] >= WINDOW_S

    def window(self, active: int) -> Window | None:
        now = self._now(active)
        last, self._last = self._last, now
        if last is None or now[1] < last[1]:  # a new epoch reset the counters
            return None
        usage = self._workers.slot_usage() or {}
        started = max(1, sum(1 for w in range(active) if self._workers.pid(w) is not None))
        headroom, limit = _cgroup.memory_headroom()
        return Window(
            seconds=now[0] - last[0], waited_s=now[1] - last[1], main_cpu_s=now[2] - last[2],
            # a worker restarted during the window counts from zero: never negative
            worker_cpu_s=max(0.0, now[3] - last[3]), worker_busy_s=max(0.0, now[4] - last[4]),
            usable_cpus=self._cpus, worker_rss=now[5],
            slot_bytes_per_worker=int(usage.get("bytes_mapped", 0)) // started,
            memory_headroom=headroom, memory_limit=limit,
        )


# -- the iterator's side (called by _iterator.MultiProcessIter) ---------------------------------
def attach(it) -> tuple[Tuner, Measure]:
    """A tuner for iterator `it` (a map-style dataset, num_workers > 1): the task table sends to
    the tuner's first `active` workers; only those are started now."""
    prev = it._state.autotune  # an earlier iterator of this loader learnt a count
    n = it._num_workers
    tuner = Tuner(n, prev["active_workers"] if prev and prev["max_workers"] == n else None)
    if prev and prev["max_workers"] == n:
        tuner.reason = tuner.decisions[0].reason = (
            f"started {tuner.active} of at most {n} workers (the count the last epoch ended with)")
    it._tasks.limit = tuner.active
    it._state.autotune = tuner.snapshot()
    it._board.set("active_workers", tuner.active)
    return tuner, Measure(it._stats, it._set, _cgroup.usable_cpus())


def tune(it) -> None:
    """One window is over: let the tuner decide, and apply its decision."""
    tasks = it._tasks
    w = it._measure.window(tasks.limit)
    if w is None:
        return
    noted = len(it._tuner.decisions)
    active = it._tuner.decide(w, it._stats.yielded)
    if active != tasks.limit:
        set_active(it, active)
    elif len(it._tuner.decisions) != noted:  # a decision not to change (the memory budget)
        it._state.autotune = it._tuner.snapshot()


def set_active(it, active: int) -> None:
    """Workers 0..active-1 take the tasks from now on. A worker added is started if it never
    was; one retired keeps its process and finishes the tasks it has (they are yielded in
    their place: the order is the sampler's whatever worker loads a task)."""
    tasks = it._tasks
    for w in range(tasks.limit, active):
        if it._set.pid(w) is None:
            it._start(lambda w=w: it._set.start(w))
    tasks.limit = active
    it._board.set("active_workers", active)
    it._state.autotune = it._tuner.snapshot()
    it._measure.restart(active)
    while tasks.has_room() and not it._shutdown:
        sent = tasks.send_idx
        it._try_put_index()
        if tasks.send_idx == sent:  # the sampler is done for this epoch
            break
