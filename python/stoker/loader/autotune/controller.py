"""Applying the tuner's decisions to an iterator, through a small protocol (``Tunable``).

The controller reads windows (``measure.Measure``), asks the ``Tuner``, and changes the iterator
(passed to each call: the controller keeps no reference to it) only through ``Tunable``'s
methods: how many workers take tasks (a worker added is started if it
never was; one retired keeps its process, idle, and finishes the tasks it has) and how many tasks
each may hold. What it learnt stays in the loader's records, so the next iterator of the loader
starts from there; ``stoker top`` reads the count and the depth from the loader's board.

Thread contract: the iterating thread; ``snapshot`` returns plain data.
"""

from __future__ import annotations

from typing import Protocol

from ...common import system as _system
from ...wire.board import TUNED_DEPTH, TUNED_WORKERS
from . import memory
from .measure import Measure
from .tuner import Tuner


class Tunable(Protocol):
    """What the controller needs of the iterator it tunes."""

    def active_workers(self) -> int:
        """How many workers take tasks now."""

    def depth(self) -> int:
        """How many tasks each worker may hold now."""

    def taking(self) -> list[int]:
        """The workers that take tasks now (an IterableDataset's ended workers do not)."""

    def set_workers(self, active: int) -> None:
        """Workers ``0 .. active-1`` take the tasks from now on (starting any not started)."""

    def set_depth(self, depth: int) -> None:
        """Each worker may hold up to `depth` tasks from now on."""

    def refill(self) -> None:
        """Sends tasks while there is room."""


def wanted(options, map_style: bool, num_workers: int) -> tuple[bool, bool]:
    """(tune the worker count, tune the depth) for an iterator with these options."""
    return (options.autotune and map_style and num_workers > 1, options.autotune_prefetch)


class Controller:
    def __init__(self, records, board, stats, workers, *, num_workers: int,
                 depth: int, tune_workers: bool, tune_depth: bool, dataset=None,
                 batch_size=None):
        """A tuner for an iterator: it starts with the first ``initial_workers`` workers and
        ``initial_depth``; an earlier iterator of this loader (its `records`) left what it
        learnt, and this one starts from there; without one, from what the latest loader of
        `dataset` in this process learnt (``memory``), when that loader had the same bound,
        `batch_size`, starting `depth` and tuned the same things."""
        self._records = records
        self._board = board
        self._dataset = dataset
        self._fingerprint = (num_workers, batch_size, depth, tune_workers, tune_depth)
        prev = records.autotune
        where = "where the last epoch ended"
        if not prev and dataset is not None:
            prev = memory.recall(dataset, self._fingerprint)
            where = "where the last loader of this dataset ended"
        same = bool(prev) and prev["max_workers"] == num_workers
        initial = prev["active_workers"] if same and tune_workers else None
        start_depth = None
        if tune_depth:
            start_depth = (prev or {}).get("prefetch_factor") or depth
        self.tuner = Tuner(num_workers, initial, tune_workers=tune_workers, depth=start_depth)
        t = self.tuner
        if prev and (initial is not None or (prev or {}).get("prefetch_factor")):
            t.reason = t.decisions[0].reason = t.reason + f" ({where})"
        if t.depth is not None:
            board.set("prefetch_factor", t.depth)
        if tune_workers:
            board.set("active_workers", t.active)
        board.set("tuned", (TUNED_WORKERS if tune_workers else 0)
                  | (TUNED_DEPTH if t.depth is not None else 0))
        self._keep()
        # the CPUs it judges "a core is free" against: this rank's share of the machine
        self.measure = Measure(stats, workers, _system.rank_cpus())

    def _keep(self) -> None:
        snap = self.tuner.snapshot()
        self._records.autotune = snap
        if self._dataset is not None:
            memory.keep(self._dataset, self._fingerprint, snap)

    def set_memory_share(self, share: int | None) -> None:
        """Each worker's part of max_shared_memory now (the depth must fit in it)."""
        self.measure.share = share

    @property
    def initial_workers(self) -> int:
        return self.tuner.active

    @property
    def initial_depth(self) -> int | None:
        return self.tuner.depth

    def due(self, target: Tunable) -> bool:
        return self.measure.due(target.taking())

    def restart_window(self, target: Tunable) -> None:
        self.measure.restart(target.taking())

    def tune(self, target: Tunable, batch: int) -> None:
        """One window of `target` is over (at `batch`): let the tuner decide, and apply its
        decision."""
        w = self.measure.window(target.taking())
        if w is None:
            return
        t = self.tuner
        noted = len(t.decisions)
        active = t.decide(w, batch)
        if active != target.active_workers() or (t.depth is not None
                                                 and t.depth != target.depth()):
            self._apply(target, active, t.depth)
        elif len(t.decisions) != noted:  # a decision not to change (the memory budget)
            self._keep()

    def _apply(self, target: Tunable, active: int, depth: int | None) -> None:
        target.set_workers(active)
        if self.tuner.tune_workers:
            self._board.set("active_workers", active)
        if depth is not None:
            target.set_depth(depth)
            self._board.set("prefetch_factor", depth)
        self._keep()
        self.restart_window(target)
        target.refill()

    def snapshot(self) -> dict:
        return self.tuner.snapshot()
