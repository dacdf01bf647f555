"""One window of what the tuner judges, read from the iterator's statistics and its placement.

``Measure`` takes a reading at the start of a window and again at its end: wall-clock seconds,
the seconds the training loop waited for data and the batches it took, the main process's CPU
and the seconds its threads waited for a CPU (the kernel's run queue: ``system.runqueue_seconds``),
and, over the workers that take tasks, their CPU and run-queue seconds (``Workers.schedstat_of``:
to the nanosecond where the placement reads the kernel's schedstat, a local worker's; else the
view's CPU and no run queue, a node pool's worker's), the batches they sent, their busy time
(loading, collating, encoding: from their own status), the largest RSS, the slots' memory, and
the memory headroom. A window in which a worker was replaced (its counters started again from
zero) or the epoch's counters were reset is not judged.

Thread contract: the iterating thread.
"""

from __future__ import annotations

import time

from ...common import system as _system
from .window import Window

WINDOW_S = 0.25  # the tuner looks this often (and after at least one batch)
# The first look (tuner.py): this many batches after the first one the loop received (the wait
# for the first one is start-up, not a shortage of workers).
FIRST_BATCHES = 4


class Measure:
    def __init__(self, stats, workers, usable_cpus: int, shared_memory_share: int | None = None):
        """`stats`: the iterator's (``waited_s``); `workers`: the placement (``view``,
        ``slot_usage``)."""
        self._stats = stats
        self._workers = workers
        self._cpus = usable_cpus
        self.share = shared_memory_share  # each worker's part of max_shared_memory (None: none)
        self._last = None
        self._first = "waiting"  # the first look: "waiting" for batch 1, "due", then None

    def _now(self, ids):
        busy = 0.0
        cpu = queued = 0.0
        rss = made = 0
        pids = []
        for w in ids:
            v = self._workers.view(w)
            st = v.status if v is not None else None
            if st:
                s = st["seconds_in"]
                busy += s["loading"] + s["collating"] + s["encoding"]
                rss = max(rss, st["rss_bytes"])
                made += st.get("batches") or 0
            pid = v.pid if v is not None else None
            pids.append(pid)
            if pid is not None:
                both = self._workers.schedstat_of(w)
                cpu += both[0] if both is not None else v.cpu_seconds
                queued += both[1] if both is not None else 0.0
        return (time.monotonic(), self._stats.waited_s, time.process_time(), cpu, busy, rss,
                tuple(ids), tuple(pids), self._stats.yielded, _system.runqueue_seconds() or 0.0,
                queued, made)

    def restart(self, ids) -> None:
        """Starts a window (after a change: the new worker's counters start from here)."""
        self._last = self._now(ids)

    def due(self, ids=()) -> bool:
        """A window is over. `ids`: the workers taking tasks (the first look starts its window
        at the first batch, over them)."""
        if self._first == "waiting":
            if self._stats.yielded >= 1:
                self._last = self._now(ids)
                self._first = "due"
            return False
        if self._first == "due":  # FIRST_BATCHES batches, or a window's time (tiny epochs)
            return self._last is not None and (
                self._stats.yielded - self._last[8] >= FIRST_BATCHES
                or time.monotonic() - self._last[0] >= WINDOW_S)
        return self._last is None or time.monotonic() - self._last[0] >= WINDOW_S

    def window(self, ids) -> Window | None:
        """The window since the last one, over workers `ids` (those that take tasks)."""
        now = self._now(ids)
        last, self._last = self._last, now
        first, self._first = self._first == "due", None
        if last is None or now[1] < last[1] or now[6:8] != last[6:8]:
            # a new epoch reset the counters, a stream's worker ended, or a worker was
            # restarted (its counters start from zero: the window would read as idle workers
            # while the loop waited for the death to be handled)
            return None
        usage = self._workers.slot_usage() or {}
        started = max(1, sum(1 for pid in now[7] if pid is not None))
        mapped, slots = int(usage.get("bytes_mapped", 0)), int(usage.get("slots", 0))
        headroom, limit = _system.memory_headroom()
        return Window(
            seconds=now[0] - last[0], waited_s=now[1] - last[1], main_cpu_s=now[2] - last[2],
            worker_cpu_s=max(0.0, now[3] - last[3]), worker_busy_s=max(0.0, now[4] - last[4]),
            main_runqueue_s=max(0.0, now[9] - last[9]),
            worker_runqueue_s=max(0.0, now[10] - last[10]),
            usable_cpus=self._cpus, worker_rss=now[5],
            slot_bytes_per_worker=mapped // started,
            memory_headroom=headroom, memory_limit=limit, workers=len(ids),
            slot_bytes=mapped // slots if slots else 0, shared_memory_share=self.share,
            batches=max(0, now[8] - last[8]), made=max(0, now[11] - last[11]), first=first,
        )
