"""The iterator's statistics: what the training loop waited, the data-stall notice, ``stats()``.

Counters are written by the iterating thread and mirrored on the loader's board (read by
``stoker top`` in another process); ``snapshot`` and ``loader_stats`` may be called from any
thread (a monitoring thread, the Prometheus collector): they read plain numbers and the
placement's thread-safe views.
"""

from __future__ import annotations

import logging
import time

from ...common import advice as _advice
from ...common.indices import jsonable
from ...config.records import records_of
from ...wire import board as _board

log = logging.getLogger("stoker")

# The data-stall notice looks every this many batches, once the loop has run this long.
STALL_CHECK_BATCHES = 20
STALL_MIN_S = 2.0

_STAGES = {"loading": "__getitem__ (loading samples)", "collating": "collate_fn",
           "encoding": "writing batches into shared memory"}


class IterStats:
    def __init__(self, board: _board.Board, workers, watch, restarts, stall_notice,
                 threads_per_worker=1):
        """`workers`: the placement; `watch`: the hang watch (stuck workers); `restarts`: the
        list of restarts per worker (the recovery's); `threads_per_worker`: the option, for
        the notice's advice."""
        self._threads = threads_per_worker
        self._board = board
        self._workers = workers
        self._watch = watch
        self._restarts = restarts
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
        stuck = "".join(f" Also: {s.describe()}." for s in self._watch.stuck().values())
        log.warning(
            "stoker: the training loop waited for data %.0f%% of the time over %d batches: the "
            "data is the bottleneck. Workers spend most of their time in %s (%s). %s%s",
            100 * self.waited_s / elapsed, self.yielded, _STAGES[slowest], split,
            advice(slowest, self._workers.cpu_seconds(), sum(busy.values()), self._threads,
                   self._workers.scale_hint(), self._workers.runqueue_seconds()), stuck,
        )

    def snapshot(self) -> dict:
        started = self.started_at
        elapsed = (time.monotonic() - started) if started else 0.0
        waited = self.waited_s
        workers = self._workers.stats()
        stuck = self._watch.stuck()
        for entry in workers:
            entry["restarts"] = self._restarts[entry["id"]]
            if entry["id"] in stuck:
                entry["stuck"] = stuck[entry["id"]].describe()
        return {
            "workers": workers,
            "batches_yielded": self.yielded,
            "seconds_waiting_for_data": waited,
            "data_stall": (waited / elapsed) if elapsed > 0 else 0.0,
            "memory": self._workers.slot_usage(),
        }


def advice(slowest: str, cpu_s, busy_s: float, threads, scale_hint: str,
           runqueue_s=None) -> str:
    """What would help a data stall: workers that wait get "raise threads_per_worker"; workers
    that compute (on a CPU, or waiting `runqueue_s` for one) on a machine whose CPUs are taken
    are told so; others get the placement's `scale_hint` (more workers, cheaper samples)."""
    if slowest == "loading" and _advice.waiting(cpu_s, busy_s, runqueue_s):
        return _advice.raise_threads(cpu_s, busy_s, threads)
    if cpu_s is not None and _advice.crowded(runqueue_s, busy_s):
        return _advice.cpus_taken(cpu_s, runqueue_s, busy_s)
    return scale_hint


def loader_stats(loader) -> dict:
    """``stats()`` for any loader stoker has served (see ``DataLoader.stats``)."""
    rec = records_of(loader)
    it = rec.live_iterator()
    live = it.stats() if it is not None else {
        "workers": [], "batches_yielded": 0, "seconds_waiting_for_data": 0.0,
        "data_stall": 0.0, "memory": {}}
    if "autotune" not in live and rec.autotune is not None:
        live["autotune"] = rec.autotune
    live.update({
        "loader": f"{type(loader).__module__}.{type(loader).__qualname__}",
        "served_by": rec.served_by,
        "epoch": rec.epoch,
        "num_workers": loader.num_workers,
        "deaths": [{"worker_id": d.worker_id, "pid": d.pid, "signal": d.signal,
                    "exit_code": d.exit_code, "cause": d.cause, "index": jsonable(d.index),
                    "epoch": d.epoch} for d in list(rec.deaths)],
        "skipped": [{"index": jsonable(s.index), "reason": s.reason, "epoch": s.epoch}
                    for s in list(rec.skipped)],
        # (copies, taken at once: the iterating thread may add to them while another reads)
        "quarantined": sorted((jsonable(q) for q in list(rec.quarantined)), key=repr),
    })
    return live
