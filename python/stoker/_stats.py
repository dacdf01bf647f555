"""The iterator's statistics: what the training loop waited, the data-stall notice, ``stats()``.

Counters are written by the iterating thread and mirrored on the loader's board (read by
``stoker top`` in another process); ``snapshot`` may be called from any thread (a monitoring
thread, the Prometheus collector): it reads plain numbers and the worker set's thread-safe views.
"""

from __future__ import annotations

import logging
import os
import time

from . import _board

log = logging.getLogger("stoker")

# The data-stall notice looks every this many batches, once the loop has run this long.
STALL_CHECK_BATCHES = 20
STALL_MIN_S = 2.0

_STAGES = {"loading": "__getitem__ (loading samples)", "collating": "collate_fn",
           "encoding": "writing batches into shared memory"}


class IterStats:
    def __init__(self, board: _board.Board, workers, stall_notice):
        self._board = board
        self._workers = workers
        self._stall_notice = stall_notice
        self.new_epoch(0)

    def new_epoch(self, epoch: int) -> None:
        self.yielded = 0
        self.waited_s = 0.0
        self.started_at = None  # when the loop first asked for a batch this epoch
        self._stall_noted = False
        self._board.set("epoch", epoch)
        self._board.set("batches_yielded", 0)
        self._board.set("waited_ns", 0)
        self._board.set("started_ns", 0)

    def asking(self) -> None:
        """The loop asks for a batch."""
        if self.started_at is None:
            self.started_at = time.monotonic()
            self._board.set("started_ns", _board.now_ns())

    def waited(self, seconds: float) -> None:
        self.waited_s += seconds
        self._board.add("waited_ns", int(seconds * 1e9))

    def yielded_one(self) -> None:
        self.yielded += 1
        self._board.add("batches_yielded")
        if not self._stall_noted and self.yielded % STALL_CHECK_BATCHES == 0:
            self._note_stall()

    def _note_stall(self) -> None:
        """One log line when the training loop waits for data more than `stall_notice` of the
        time, naming the stage the workers spend most time in, and any worker not working."""
        share = self._stall_notice
        elapsed = time.monotonic() - self.started_at
        if share is None or elapsed < STALL_MIN_S or self.waited_s / elapsed < share:
            return
        self._stall_noted = True
        totals = self._workers.seconds_in()
        busy = {k: totals.get(k, 0.0) for k in _STAGES}
        total = sum(busy.values()) or 1.0
        slowest = max(busy, key=busy.get)
        split = ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in busy.items())
        stuck = "".join(f" Also: {s.describe()}." for s in self._workers.stuck().values())
        log.warning(
            "stoker: the training loop waited for data %.0f%% of the time over %d batches: the "
            "data is the bottleneck. Workers spend most of their time in %s (%s). More "
            "num_workers (this process may use %d CPUs), cheaper samples or a larger "
            "prefetch_factor would help (num_workers=\"auto\" and prefetch_factor=\"auto\" "
            "tune both).%s", 100 * self.waited_s / elapsed, self.yielded,
            _STAGES[slowest], split, len(os.sched_getaffinity(0)), stuck,
        )

    def snapshot(self) -> dict:
        started = self.started_at
        elapsed = (time.monotonic() - started) if started else 0.0
        waited = self.waited_s
        return {
            "workers": self._workers.stats(),
            "batches_yielded": self.yielded,
            "seconds_waiting_for_data": waited,
            "data_stall": (waited / elapsed) if elapsed > 0 else 0.0,
            "memory": self._workers.slot_usage(),
        }
