"""num_workers="auto" and prefetch_factor="auto": how many workers take tasks and how many
tasks each may hold, decided during the epoch from what the iterator measures.

Workers. The loader is built with ``num_workers`` = the bound (the usable CPUs); the iterator
starts ``initial`` of them and sends tasks to the first ``active`` workers only. Every
``WINDOW_S`` the ``Tuner`` looks at the last window:

- the loop waited for data (stall share above ``ADD_STALL``) and a core is free (the main process
  and the active workers together were on a CPU or waiting for one less than usable CPUs -
  ``FREE_CORE``: time on the kernel's run queue is computing, a machine whose CPUs are taken has
  none free) and the memory budget has room for one more worker (its RSS and its share of the
  slots, against the cgroup's limit or the machine's available memory): one more worker;
- the loop hardly waited (below ``RETIRE_STALL``) and the active workers' busy time would fit in
  one worker fewer with room to spare, two windows in a row: one worker fewer (it keeps its
  process, idle, and is the first one added back);
- the loop did not wait for data (``ADD_STALL`` at most) but waited for a CPU (its threads on
  the run queue ``STARVED`` of the window or more: the workers, or whatever else runs, took its
  cores), the workers compute (``advice.waiting``: workers that wait on I/O take little of its
  CPU) and one worker fewer would still need no more CPU per batch each than the loop itself,
  give or take ``STARVED`` (so they keep pace with it on cores of their own), two windows in a
  row: one worker fewer. A training step that computes is the job; workers that take its CPU
  slow it down.

A batch's costs: the loop's per batch it took, the workers' per batch they sent (their status
pages' count): the two differ while the workers' queues fill. CPU seconds are the kernel's
schedstat where the placement reads it (a local worker's: to the nanosecond; ``/proc/PID/stat``
counts 10 ms ticks, as much as a few batches cost).

The first look. A short epoch (a validation pass, a small dataset: well under a second) is over
before one worker a window has climbed far. So the first window is short (``measure.FIRST_
BATCHES`` batches from the first one delivered) and judged differently: from what one batch costs
(the workers' busy time and CPU per batch, the main process's own time and CPU per batch, CPU
counting the run queue's time) the tuner computes the count that keeps up with the loop within
the CPUs (``needed``) and goes there at once; a loop that waited for a CPU, and not for data
(or only while the workers' queues filled: they sent a batch each more than it took), goes at
once to the fewest workers that keep pace with it (``keeping_pace``), and a loop that waited
for a CPU is given no more workers that compute than that, nor more than ``needed`` (workers
that keep pace but are not needed take its CPU). As for one more worker later, a
core must be free (the pipeline on a CPU or its run queue less than the usable CPUs -
``FREE_CORE``): a few batches' costs over the usable CPUs cannot tell that other processes
took them. Later windows then
refine it one worker at a time. What it decided is kept: the next
epoch of the loader starts there, and so does the next loader of the same dataset in this
process (``memory.py``).

Depth (prefetch_factor, tasks in flight per worker). It starts at torch's 2 and is judged over
longer windows (``DEPTH_WINDOW_S``: a queue's worth shows over several batches):

- the loop waited for data while workers sat idle (idle worker-seconds at least ``IDLE_SHARE`` of
  the seconds waited: a slow batch held the line and the others had nothing left to do) and one
  more batch per worker fits the memory budget and the shared-memory cap: one deeper, up to
  ``MAX_DEPTH``. This is the mechanism itself, not a guess: a worker idles only when it has no
  task, and it has none because the queue was full; with one more place it would have worked.
  (Checking the gain afterwards was tried and dropped: over a second, a random latency tail
  makes the wait per batch swing by more than one step of depth changes it, so such a check
  undid good steps about as often as it kept them.)
- the memory limit is near (less than ``MEMORY_MARGIN`` of it free): one shallower, down to 1.

When both are tuned, a stall with idle workers deepens the queue and a stall with busy workers
adds a worker. Which worker loads a task does not change which samples are delivered nor their
order (tasks are numbered in the sampler's order and yielded in that order); with
``seed="per_sample"`` the values do not change either. The depth does not even change which
worker loads a task (tasks go round the workers in turn whatever the depth), so with a fixed
``num_workers`` the batches are torch's, values included. An IterableDataset's worker count is
not tuned (each worker yields its own shard, so all ``num_workers`` run); its depth is.

``Tuner`` (this file) is plain arithmetic on numbers it is given (unit-tested with synthetic
ones); ``measure.Measure`` reads them from the iterator's statistics and the placement;
``controller.Controller`` applies the decisions to the iterator through a small protocol.
docs/design/autotune.md has the reasoning.

Thread contract: a Tuner belongs to the iterating thread; ``snapshot`` returns plain data.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ...common import system as _system
from .window import (
    Window,
    idle_while_waiting,
    keeping_pace,
    needed,
    pipeline_cpu_s,
    starved,
    worker_cpu_per_batch,
)

log = logging.getLogger("stoker")

ADD_STALL = 0.05  # add a worker when the loop waited more than this share of the window
RETIRE_STALL = 0.01  # retire one only when the loop waited less than this
FREE_CORE = 0.75  # a core is free when this much CPU is left over
RETIRE_FIT = 0.7  # retire when the busy time fits in k-1 workers at most this busy
MEMORY_MARGIN = 0.1  # keep this share of the memory limit free
KEEP_DECISIONS = 20
# prefetch_factor="auto"
START_DEPTH = 2  # torch's default
MAX_DEPTH = 8
DEPTH_WINDOW_S = 1.0  # the depth is judged over windows at least this long


@dataclass
class Decision:
    batch: int
    active: int
    reason: str
    prefetch_factor: int | None = None


class Tuner:
    """Decides the active workers (``tune_workers``) and the depth (``depth`` not None)."""

    def __init__(self, bound: int, initial: int | None = None, *, tune_workers: bool = True,
                 depth: int | None = None):
        self.bound = max(1, bound)
        self.tune_workers = tune_workers
        if not tune_workers:
            initial = self.bound
        # Half the CPUs, and at least two: one worker cannot hide a single slow sample, and a
        # short first epoch is over before a second one would have started and warmed up. But
        # never every CPU: the training loop keeps one (on 2 CPUs, 2 workers that compute took
        # the loop's CPU until the first look shed one, and their start cost a short epoch).
        self.active = initial if initial is not None else \
            min(max(2, self.bound // 2), max(1, self.bound - 1))
        self.active = min(self.bound, max(1, self.active))
        # a starting depth above MAX_DEPTH (the user's own prefetch_factor under enable()) is
        # kept: the tuner only grows up to MAX_DEPTH and shrinks for memory
        self.depth = None if depth is None else max(1, depth)
        parts = []
        if tune_workers:
            parts.append(f"started {self.active} of at most {self.bound} workers")
        if self.depth is not None:
            parts.append(f"prefetch_factor {self.depth} (tuned up to {MAX_DEPTH})"
                         if self.depth <= MAX_DEPTH else
                         f"prefetch_factor {self.depth} (above the {MAX_DEPTH} the tuner grows "
                         "to: kept, lowered only when memory is short)")
        self.reason = ", ".join(parts)
        self.decisions: list[Decision] = [Decision(0, self.active, self.reason, self.depth)]
        self.settled_at: int | None = None  # the batch of the last change
        self._quiet_windows = 0
        self._skip_next = False
        self._acc = _Sums()  # the depth's window so far

    def decide(self, w: Window, batch: int) -> int:
        """The number of active workers after window `w` (seen at batch `batch`); the depth
        after it is ``self.depth``."""
        if self._skip_next:  # the window straddles the last change: it says little
            self._skip_next = False
            return self.active
        if w.seconds <= 0:
            return self.active
        if w.first:
            return self._first_look(w, batch) if self.tune_workers else self.active
        if self.depth is not None:
            if self._decide_depth(w, batch):
                return self.active
        if self.tune_workers:
            return self._decide_workers(w, batch)
        return self.active

    # -- workers ---------------------------------------------------------------------------------
    def _decide_workers(self, w: Window, batch: int) -> int:
        stall = w.waited_s / w.seconds
        used = pipeline_cpu_s(w) / w.seconds  # on a CPU or waiting for one
        free = w.usable_cpus - used
        if stall > ADD_STALL:
            self._quiet_windows = 0
            if self.active >= self.bound:
                return self.active
            if free < FREE_CORE:
                return self.active
            if self._depth_may_grow() and idle_while_waiting(w):
                return self.active  # idle workers: a deeper queue, not one more worker
            need = w.worker_rss + w.slot_bytes_per_worker
            if w.memory_headroom is not None and w.memory_limit:
                if w.memory_headroom - need < MEMORY_MARGIN * w.memory_limit:
                    self._note(batch, self.active, (
                        f"not adding a worker: the loop waited {100 * stall:.0f}% of the time, "
                        f"but one more (~{_system.human_bytes(need)}) would leave less than "
                        f"{100 * MEMORY_MARGIN:.0f}% of the memory limit "
                        f"({_system.human_bytes(w.memory_limit)}) free"), change=False)
                    return self.active
            share = w.shared_memory_share
            if share is not None and w.slot_bytes_per_worker:
                # max_shared_memory is divided among the workers running: one more takes its
                # part from the others, each of which must still hold what it holds now
                after = share * self.active // (self.active + 1)
                if w.slot_bytes_per_worker > after:
                    self._note(batch, self.active, (
                        f"not adding a worker: the loop waited {100 * stall:.0f}% of the time, "
                        f"but max_shared_memory divided among {self.active + 1} workers would "
                        f"leave each {_system.human_bytes(after)}, less than the "
                        f"{_system.human_bytes(w.slot_bytes_per_worker)} each one's batches "
                        "take now"), change=False)
                    return self.active
            self._change(batch, self.active + 1, self.depth, (
                f"{self.active} -> {self.active + 1} workers: the loop waited for data "
                f"{100 * stall:.0f}% of the time and {free:.1f} of {w.usable_cpus} CPUs were free"))
            return self.active
        why = self._retiring(w, stall) if self.active > 1 else None
        if why is not None:
            self._quiet_windows += 1
            if self._quiet_windows >= 2:
                self._quiet_windows = 0
                self._change(batch, self.active - 1, self.depth, why)
            return self.active
        self._quiet_windows = 0
        return self.active

    def _retiring(self, w: Window, stall: float) -> str | None:
        """Why one worker fewer would do, from window `w`; None when it would not."""
        k = self.active
        if stall < RETIRE_STALL and w.worker_busy_s / w.seconds / (k - 1) < RETIRE_FIT:
            return (f"{k} -> {k - 1} workers: the loop waited {100 * stall:.1f}% of the time and "
                    f"the workers were busy {w.worker_busy_s / w.seconds:.1f} worker-seconds per "
                    f"second: {k - 1} suffice")
        if stall <= ADD_STALL and keeping_pace(w) < k:
            return (f"{k} -> {k - 1} workers: the training loop waited for a CPU "
                    f"{100 * w.main_runqueue_s / w.seconds:.0f}% of the time (for data "
                    f"{100 * stall:.1f}%), and {k - 1} workers keep pace with it, each "
                    f"needing no more CPU per batch than the loop: fewer take less of its CPU")
        return None

    def _first_look(self, w: Window, batch: int) -> int:
        """Straight to the count one batch's costs call for: when the loop waited for data, the
        count that keeps up with it; when it waited for a CPU instead, the fewest that keep
        pace with it."""
        stall = w.waited_s / w.seconds
        # the workers sent a batch each more than the loop took: their queues filled, and what
        # the loop waited for data was their start
        filling = w.made >= w.batches + self.active
        pace = keeping_pace(w)
        # A starved loop is also given no more workers than keep up with it within the CPUs
        # (``needed``): workers that keep pace but are not needed only take its CPU. (A short
        # epoch is over before the later windows' two-in-a-row shed the spare one.)
        enough = needed(w) if w.batches and starved(w) else 1 << 30
        if (stall <= ADD_STALL or filling) and w.batches and min(pace, enough) < self.active:
            k = min(pace, enough)
            which = (f"{k} keep pace with it (a batch takes a worker "
                     f"{1e3 * worker_cpu_per_batch(w):.1f} ms of CPU, the loop "
                     f"{1e3 * w.main_cpu_s / w.batches:.1f} ms)" if pace <= enough else
                     f"{k} keep up with it within the {w.usable_cpus} CPUs (a batch takes a "
                     f"worker {1e3 * w.worker_busy_s / max(1, w.made or w.batches):.1f} ms, "
                     f"the loop {1e3 * (w.seconds - w.waited_s) / w.batches:.1f} ms)")
            self._change(batch, k, self.depth, (
                f"{self.active} -> {k} workers at the first look: the training loop waited for "
                f"a CPU {100 * w.main_runqueue_s / w.seconds:.0f}% of the time (for data "
                f"{100 * stall:.1f}%), and {which}"))
            return self.active
        if stall <= ADD_STALL or not w.batches or self.active >= self.bound:
            return self.active
        if w.usable_cpus - pipeline_cpu_s(w) / w.seconds < FREE_CORE:
            return self.active  # no core free (as for one more worker later)
        # (a loop starved of CPU: no more workers that compute than keep pace with it, whatever
        # a few batches' costs say the CPUs fit)
        k = min(self.bound, needed(w), keeping_pace(w))
        if k <= self.active:
            return self.active
        if w.memory_headroom is not None and w.memory_limit:
            per = w.worker_rss + w.slot_bytes_per_worker
            room = (w.memory_headroom - MEMORY_MARGIN * w.memory_limit) // max(1, per)
            k = min(k, self.active + max(0, int(room)))
        share = w.shared_memory_share
        if share is not None and w.slot_bytes_per_worker:
            while k > self.active and share * self.active // k < w.slot_bytes_per_worker:
                k -= 1
        if k <= self.active:
            return self.active
        per_batch = w.worker_busy_s / w.batches
        step = (w.seconds - w.waited_s) / w.batches
        self._change(batch, k, self.depth, (
            f"{self.active} -> {k} workers at the first look: a batch takes a worker "
            f"{1e3 * per_batch:.1f} ms and the loop {1e3 * step:.1f} ms of its own, it waited "
            f"{100 * stall:.0f}% of the time, and {w.usable_cpus} CPUs fit {k}"))
        return self.active

    # -- depth -----------------------------------------------------------------------------------
    def _depth_may_grow(self) -> bool:
        return self.depth is not None and self.depth < MAX_DEPTH

    def _decide_depth(self, w: Window, batch: int) -> bool:
        """Judges the depth once its window is long enough; True when it changed."""
        acc = self._acc
        acc.add(w)
        if acc.seconds < DEPTH_WINDOW_S:
            return False
        self._acc = _Sums()
        stall = acc.waited_s / acc.seconds
        d = self.depth
        if acc.memory_limit and acc.memory_headroom is not None and d > 1 \
                and acc.memory_headroom < MEMORY_MARGIN * acc.memory_limit:
            return self._change(batch, self.active, d - 1, (
                f"prefetch_factor {d} -> {d - 1}: less than {100 * MEMORY_MARGIN:.0f}% of the "
                f"memory limit ({_system.human_bytes(acc.memory_limit)}) is free"))
        if stall <= ADD_STALL or not self._depth_may_grow() or not idle_while_waiting(acc):
            return False
        workers = acc.workers or self.active
        need = workers * acc.slot_bytes
        if acc.shared_memory_share is not None and acc.slot_bytes \
                and (d + 2) * acc.slot_bytes > acc.shared_memory_share:
            self._note(batch, self.active, (
                f"prefetch_factor stays {d}: the loop waited {100 * stall:.0f}% of the time with "
                f"workers idle, but {d + 2} batches of "
                f"{_system.human_bytes(acc.slot_bytes)} per worker would not fit its share of "
                f"max_shared_memory ({_system.human_bytes(acc.shared_memory_share)})"),
                change=False)
            return False
        if acc.memory_limit and acc.memory_headroom is not None \
                and acc.memory_headroom - need < MEMORY_MARGIN * acc.memory_limit:
            self._note(batch, self.active, (
                f"prefetch_factor stays {d}: the loop waited {100 * stall:.0f}% of the time with "
                f"workers idle, but one more batch per worker (~{_system.human_bytes(need)}) "
                f"would leave less than {100 * MEMORY_MARGIN:.0f}% of the memory limit free"),
                change=False)
            return False
        idle = (acc.worker_seconds - acc.worker_busy_s) / acc.seconds
        return self._change(batch, self.active, d + 1, (
            f"prefetch_factor {d} -> {d + 1}: the loop waited for data {100 * stall:.0f}% of the "
            f"time while {idle:.1f} of {workers} workers sat idle (a slow batch held the line)"))

    # -- records ---------------------------------------------------------------------------------
    def _change(self, batch: int, active: int, depth: int | None, reason: str) -> bool:
        self._note(batch, active, reason, depth=depth)
        self.active = active
        self.depth = depth
        self.settled_at = batch
        self._skip_next = True
        self._acc = _Sums()
        return True

    def _note(self, batch, active, reason, change=True, depth=None) -> None:
        if not change and self.reason == reason:
            return
        self.reason = reason
        self.decisions.append(Decision(batch, active, reason,
                                       depth if change else self.depth))
        del self.decisions[:-KEEP_DECISIONS]
        log.info("stoker: autotune: %s (at batch %d)", reason, batch)

    def snapshot(self) -> dict:
        return {
            "active_workers": self.active,
            "max_workers": self.bound,
            "workers_tuned": self.tune_workers,
            "prefetch_factor": self.depth,
            "reason": self.reason,
            "last_change_at_batch": self.settled_at,
            "decisions": [{"batch": d.batch, "active": d.active, "prefetch_factor":
                           d.prefetch_factor, "reason": d.reason} for d in self.decisions],
        }


class _Sums:
    """Windows added up (the depth's longer window); the latest memory figures."""

    def __init__(self):
        self.seconds = self.waited_s = self.worker_busy_s = 0.0
        self.workers = 0
        self.slot_bytes = 0
        self.shared_memory_share = None
        self.memory_headroom = self.memory_limit = None
        self.worker_seconds = 0.0

    def add(self, w: Window) -> None:
        self.seconds += w.seconds
        self.waited_s += w.waited_s
        self.worker_busy_s += w.worker_busy_s
        self.worker_seconds += w.worker_seconds
        self.workers = round(self.worker_seconds / self.seconds) if self.seconds else 0
        self.slot_bytes = max(self.slot_bytes, w.slot_bytes)
        self.shared_memory_share = w.shared_memory_share
        self.memory_headroom, self.memory_limit = w.memory_headroom, w.memory_limit
