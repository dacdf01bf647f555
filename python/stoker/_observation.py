"""Observation for the multi-process iterator: counters, the data-stall notice, stats().

A mixin of ``MultiProcessIter``; the board it writes is read by ``stoker top``.
"""

from __future__ import annotations

import logging
import os
import time

from . import _board

log = logging.getLogger("stoker")

# The data-stall notice looks every this many batches, once the loop has run this long.
_STALL_CHECK_BATCHES = 20
_STALL_MIN_S = 2.0


class Observation:
    def __next__(self):
        if self._started_at is None:
            self._started_at = time.monotonic()
            self._board.set("started_ns", _board.now_ns())
        batch = super().__next__()
        self._yielded += 1
        self._board.add("batches_yielded")
        if not self._stall_noted and self._yielded % _STALL_CHECK_BATCHES == 0:
            self._note_stall()
        return batch

    def _note_stall(self) -> None:
        """One log line when the training loop waits for data more than `stall_notice` of the
        time, naming the stage the workers spend most time in."""
        share = self._opts.get("stall_notice")
        elapsed = time.monotonic() - self._started_at
        if share is None or elapsed < _STALL_MIN_S or self._waited_s / elapsed < share:
            return
        self._stall_noted = True
        totals: dict = {}
        for w in range(self._num_workers):
            st = self._sup.status(w) if self._sup.has_worker(w) else None
            for k, v in (st or {}).get("seconds_in", {}).items():
                totals[k] = totals.get(k, 0.0) + v
        busy = {k: totals.get(k, 0.0) for k in ("loading", "collating", "encoding")}
        total = sum(busy.values()) or 1.0
        slowest = max(busy, key=busy.get)
        names = {"loading": "__getitem__ (loading samples)", "collating": "collate_fn",
                 "encoding": "writing batches into shared memory"}
        split = ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in busy.items())
        log.warning(
            "stoker: the training loop waited for data %.0f%% of the time over %d batches: the "
            "data is the bottleneck. Workers spend most of their time in %s (%s). More "
            "num_workers (this process may use %d CPUs), cheaper samples or a larger "
            "prefetch_factor would help.", 100 * self._waited_s / elapsed, self._yielded,
            names[slowest], split, len(os.sched_getaffinity(0)),
        )

    def stats(self) -> dict:
        now = time.monotonic()
        elapsed = (now - self._started_at) if self._started_at else 0.0
        workers = []
        for w in range(self._num_workers):
            st = self._sup.status(w) if self._sup.has_worker(w) else None
            proc = self._procs[w]
            entry = {"id": w, "pid": proc.pid if proc is not None else None,
                     "alive": bool(st), "restarts": self._restarts_by_worker[w]}
            if st:
                entry.update({
                    "state": st["state"], "index": st["index"], "task": st["task"],
                    "samples": st["samples"], "batches": st["batches"],
                    "rss_bytes": st["rss_bytes"], "bytes_sent": st["bytes_sent"],
                    "seconds": {"getitem": st["seconds_in"]["loading"],
                                "collate": st["seconds_in"]["collating"],
                                "encode": st["seconds_in"]["encoding"],
                                "idle": st["seconds_in"]["idle"]},
                })
            workers.append(entry)
        return {
            "workers": workers,
            "batches_yielded": self._yielded,
            "seconds_waiting_for_data": self._waited_s,
            "data_stall": (self._waited_s / elapsed) if elapsed > 0 else 0.0,
            "memory": self._sup.slot_usage(),
        }

