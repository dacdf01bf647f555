"""Where an epoch is: which sampler positions the user has received, what regenerates the order,
and, for a stateful stream, each worker's state.

- ``Delivered``: positions ``[0, prefix)`` plus the few beyond it that ``in_order=False``
  delivered early; batches received.
- ``Streams``: each worker's state (``wire/stream_state.py``: its dataset's and stream's own
  states, its generators): the one that goes with the last batch the user received from it
  (what a checkpoint holds), and the one after the last outcome that reached the main process
  (what a restarted worker continues from).
- ``EpochPosition``: one epoch of one iterator, made of those plus what regenerates its order
  and how a resume replays it.
- ``SamplerStream``: the epoch's sampler iterator, counted, skipping what a resume already
  delivered, under the saved RNG.
- ``ResumePoint``: the loader's (in its records): the epoch under way and a loaded state that
  the next epoch to begin resumes.

Only ``cursor.Cursor`` writes an ``EpochPosition`` (through the ``SamplerStream`` it wraps the
sampler in, for torch's RNG at the first draw); ``checkpoint.py`` reads it. Thread contract: the
iterating thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import order as _order
from .state import State


@dataclass
class Delivered:
    prefix: int = 0  # positions [0, prefix) delivered
    extra: set = field(default_factory=set)  # positions beyond the prefix (in_order=False)
    yielded: int = 0  # batches the user received this epoch
    finished: bool = False  # the iterator said StopIteration

    def mark(self, pos: int) -> None:
        if pos == self.prefix:
            self.prefix += 1
            while self.prefix in self.extra:
                self.extra.discard(self.prefix)
                self.prefix += 1
        elif pos > self.prefix:
            self.extra.add(pos)


@dataclass
class Streams:
    """Workers' states (plain data from the workers, their generators raw), per worker."""

    received: dict = field(default_factory=dict)  # worker -> state of its last batch received
    last_worker: int | None = None  # the worker of the last batch received
    by_task: dict = field(default_factory=dict)  # task in flight -> (worker, state sent with it)
    arrived: dict = field(default_factory=dict)  # worker -> state after its last outcome
    arrived_from: set = field(default_factory=set)  # workers any outcome came from


@dataclass
class EpochPosition:
    epoch: int
    base_seed: int
    # What regenerates the order.
    torch_rng: bytes | None = None  # torch's global RNG at the sampler's first draw
    generators: tuple = ()  # the loader's generators as the epoch began
    sampler_epoch: int | None = None
    sampler_states: dict = field(default_factory=dict)  # stateful samplers, as the epoch began
    order: bytes | None = None  # an elastic resume's explicit global order
    rebatch: dict | None = None  # resumed under another batch size: what was delivered before
    length: int | None = None  # its batches, when they are not the loader's own (len(loader))
    resumed_at: int | None = None  # resumed mid-epoch: the batches received before the resume
    delivered: Delivered = field(default_factory=Delivered)
    streams: Streams = field(default_factory=Streams)
    # Replaying a resumed epoch: the first draw happens under torch_rng; positions already
    # delivered are drawn and dropped.
    replay: bool = False
    skip_prefix: int = 0
    skip_extra: frozenset = frozenset()
    task_pos: dict = field(default_factory=dict)  # multi-process: task -> sampler position
    workers: int | None = None  # the loader's num_workers (whose states `streams` holds)


class SamplerStream:
    """The epoch's sampler iterator, counted: ``pos`` is the position of the last item drawn.
    Positions already delivered before a resume are drawn and dropped (never loaded). The first
    draw records torch's global RNG state, or, when resuming, happens under the saved one and
    leaves the caller's global RNG as it was."""

    def __init__(self, inner, record: EpochPosition):
        self.inner = inner
        self.record = record
        self.pos = -1
        self._first = True

    def __iter__(self):
        return self

    def __next__(self):
        rec = self.record
        if self._first:
            self._first = False
            if rec.replay and rec.torch_rng is not None:
                mine = torch.get_rng_state()
                torch.set_rng_state(_order.rng_tensor(rec.torch_rng))
                try:
                    return self._draw()
                finally:
                    torch.set_rng_state(mine)
            rec.torch_rng = _order.rng_bytes(torch.get_rng_state())
        return self._draw()

    def _draw(self):
        rec = self.record
        while True:
            item = next(self.inner)
            self.pos += 1
            if self.pos >= rec.skip_prefix and self.pos not in rec.skip_extra:
                return item


class ResumePoint:
    """Per loader: the epoch under way (``current``), and a loaded mid-epoch state that the
    next epoch to begin resumes (``pending``, a ``state.State``). Pickles with the loader (no
    live references)."""

    def __init__(self):
        self.current: EpochPosition | None = None
        self.pending = None
        # A finished epoch's workers' states, loaded (or left by the epoch before): persistent
        # workers (and num_workers=0's dataset) carry their state into the next epoch, so the
        # epoch that begins next starts from these, taken with `carry_workers` workers.
        self.carry: dict = {}
        self.carry_workers: int | None = None
        # A loaded finished state: torch's global RNG when it was taken (the next epoch's base
        # seed and shuffle draw from it) and a persistent iterator's base seed.
        self.next_rng: bytes | None = None
        self.next_seed: int | None = None

    def __setstate__(self, d):  # a loader pickled before these existed
        self.__dict__.update({"carry": {}, "carry_workers": None, "next_rng": None,
                              "next_seed": None, **d})


def point_of(records) -> ResumePoint:
    """The loader's resume point (in its records), made on first use; a loader pickled by
    stoker 0.1 brings its old tracker, read here."""
    p = records.resume
    if isinstance(p, ResumePoint):
        return p
    new = ResumePoint()
    if p is not None:
        _from_legacy(new, p.__dict__)
    records.resume = new
    return new


def _from_legacy(point: ResumePoint, old: dict) -> None:
    rec = old.get("current")
    if rec is not None:
        r = rec.__dict__
        point.current = EpochPosition(
            r["epoch"], r["base_seed"], torch_rng=r.get("torch_rng"),
            generators=r.get("generators", ()), sampler_epoch=r.get("sampler_epoch"),
            order=r.get("order"),
            delivered=Delivered(r.get("prefix", 0), set(r.get("extra", ())),
                                r.get("yielded", 0), r.get("finished", False)),
            streams=Streams(dict(r.get("worker_states", {})), r.get("last_worker")))
    pending = old.get("pending")
    if pending is not None:  # (what it lacks takes State's defaults: sampler_states a dict)
        point.pending = State(loader={}, **{k: pending[k] for k in State.POSITION
                                            if k in pending})
