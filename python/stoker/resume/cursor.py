"""The iterator's position in its epoch: the only writer of ``EpochPosition``.

Every iterator (multi-process or not) has one ``Cursor`` and tells it what happens:

- as it is made: ``drawing_base_seed()`` around the base iterator's seed draw and
  ``base_seed(drawn)`` after it (a pending resume keeps the saved epoch's seed and leaves the
  caller's global RNG as the saved run left it);
- before an epoch's sampler iterator is made (``iter(sampler)``): ``prepare_epoch()`` takes the
  stateful samplers' states, or puts a resumed epoch's back;
- as an epoch begins: ``begin_epoch(...)`` advances the loader's epoch counter (the one place
  that does), applies a pending resume, wraps the sampler and returns an ``EpochStart`` (the
  sampler iterator to use, the base seed, the states workers restore, whose turn it is, how many
  batches to drop);
- as tasks go and come (multi-process): ``sent(task)``, ``observe(event)`` for what workers send
  (a stream's state, an outcome), ``delivered(task)`` when the outcome reached the user;
  ``here()``, ``delivered_here(pos)`` and ``stream_state_here(state)`` for one process;
  ``finished()`` at the end of the epoch;
- on a worker's death: ``restart_state(worker)``: can a new worker continue its stream, and from
  which state;
- ``pending()``: ``load_state_dict`` ran after this iterator began (it must start over).

``checkpoint.py`` reads the position (``state_dict``) and sets the pending state
(``load_state_dict``). Thread contract: the thread that iterates.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass, field

import torch
from torch.utils.data import IterableDataset

from .._errors import StateMismatchError
from ..engine.events import StreamState, is_outcome
from . import elastic
from . import order as _order
from .position import EpochPosition, SamplerStream, point_of


@dataclass
class EpochStart:
    """What an iterator begins its epoch with."""

    sampler_iter: object  # the counted sampler stream, in place of the base iterator's
    base_seed: int
    # A resumed stateful IterableDataset: worker -> the state its worker restores.
    stream_states: dict = field(default_factory=dict)
    first_worker: int | None = None  # the first task goes to this worker (a resumed stream)
    discard: int = 0  # batches to load again and drop (a stream that cannot be positioned)


class Cursor:
    def __init__(self, loader, records):
        self._loader = weakref.ref(loader)
        self._records = records
        self._point = point_of(records)
        self.record: EpochPosition | None = None
        self._stream: SamplerStream | None = None
        self._sampler_states: dict | None = None  # taken by prepare_epoch

    # -- making the iterator ---------------------------------------------------------------------
    @contextlib.contextmanager
    def drawing_base_seed(self):
        """Around the base iterator's ``__init__``: when a resume is pending, the draw of the
        base seed leaves torch's global RNG as it was (the saved run drew it before the
        checkpoint)."""
        kept = torch.get_rng_state() if self._point.pending is not None else None
        try:
            yield
        finally:
            if kept is not None:
                torch.set_rng_state(kept)

    def base_seed(self, drawn: int) -> int:
        """The base seed workers start with: the saved epoch's when a resume is pending."""
        pending = self._point.pending
        return pending.base_seed if pending is not None else drawn

    def starting_stream_states(self) -> dict:
        """What workers started before the first epoch begins restore (a pending resume of a
        stateful stream)."""
        pending = self._point.pending
        return dict(pending.worker_states or ()) if pending is not None else {}

    # -- epochs ----------------------------------------------------------------------------------
    def prepare_epoch(self) -> None:
        """Before the epoch's ``iter(sampler)``: a sampler with its own state (``Stateful``) has
        it taken (the epoch's order starts from it), or, when a resume is pending, put back as
        the saved epoch began, so its order is the saved epoch's."""
        loader = self._loader()
        pending = self._point.pending
        if pending is not None:
            _order.set_sampler_states(loader, pending.sampler_states)
            self._sampler_states = dict(pending.sampler_states)
        else:
            self._sampler_states = _order.capture_sampler_states(loader)

    def begin_epoch(self, sampler_iter, base_seed: int) -> EpochStart:
        """An epoch begins with the base iterator's new `sampler_iter` and `base_seed`."""
        loader = self._loader()
        rec_ = self._records
        rec_.epoch += 1
        point = self._point
        pending, point.pending = point.pending, None
        rec = EpochPosition(rec_.epoch, base_seed)
        rec.sampler_states = self._sampler_states or {}
        self._sampler_states = None
        start = EpochStart(None, base_seed)
        if pending is not None:
            self._apply(pending, rec, start, loader)
        else:
            rec.generators = _order.capture_generators(loader)
            rec.sampler_epoch = _order.sampler_epoch(loader)
        if rec.order is not None:  # an epoch resumed elastically: this rank's share of the rest
            s = loader.sampler
            sampler_iter = elastic.batches(elastic.share(rec.order, s.num_replicas, s.rank),
                                           loader)
        self.record = rec
        self._stream = SamplerStream(sampler_iter, rec)
        start.sampler_iter = self._stream
        point.current = rec
        return start

    def _apply(self, pending, rec: EpochPosition, start: EpochStart, loader) -> None:
        rec.base_seed = start.base_seed = pending.base_seed
        rec.torch_rng = pending.torch_rng
        rec.generators = pending.generators
        _order.set_generators(loader, rec.generators)
        rec.sampler_epoch = pending.sampler_epoch
        rec.order = pending.order
        now = _order.sampler_epoch(loader)
        if now != rec.sampler_epoch:
            raise StateMismatchError(
                f"stoker: the checkpoint was saved in the middle of an epoch whose sampler "
                f"had set_epoch({rec.sampler_epoch}), but the sampler is now at epoch {now}: "
                "the rest of that epoch would come from another order. Call "
                f"sampler.set_epoch({rec.sampler_epoch}) before iterating (or after "
                "load_state_dict, which sets it), as the saved run did."
            )
        states = dict(pending.worker_states or ())
        d = rec.delivered
        if isinstance(loader.dataset, IterableDataset) and states:
            # Each worker's stream continues from its own saved state.
            d.prefix = rec.skip_prefix = pending.position
            d.yielded = pending.batches_yielded
            rec.streams.received = dict(states)
            rec.streams.last_worker = pending.last_worker
            start.stream_states = states
            if loader.num_workers and pending.last_worker is not None:
                start.first_worker = (pending.last_worker + 1) % loader.num_workers
        elif isinstance(loader.dataset, IterableDataset):
            # Workers' streams cannot be positioned: the batches already received are loaded
            # again and dropped (their positions are marked as they go by).
            start.discard = pending.position
        else:
            d.prefix = rec.skip_prefix = pending.position
            d.extra = set(pending.delivered_after)
            rec.skip_extra = frozenset(d.extra)
            d.yielded = pending.batches_yielded
        rec.replay = True

    # -- progress --------------------------------------------------------------------------------
    def sent(self, task: int) -> None:
        """Multi-process: `task` carries the item the stream drew last."""
        self.record.task_pos[task] = self._stream.pos

    def observe(self, ev) -> None:
        """Multi-process: an event of a live task came from a worker."""
        s = self.record.streams
        if isinstance(ev, StreamState):
            s.by_task[ev.task] = (ev.worker, ev.state)
        elif is_outcome(ev):
            s.arrived_from.add(ev.worker)
            sent = s.by_task.get(ev.task)
            if sent is not None:
                s.arrived[ev.worker] = sent[1]

    def delivered(self, task: int) -> None:
        """Multi-process: the outcome of `task` reached the user (a batch, an error, or
        nothing when all its samples were skipped)."""
        rec = self.record
        pos = rec.task_pos.pop(task, None)
        if pos is not None:
            rec.delivered.mark(pos)
            rec.delivered.yielded += 1
        sent = rec.streams.by_task.pop(task, None)
        if sent is not None:
            rec.streams.received[sent[0]] = sent[1]
            rec.streams.last_worker = sent[0]

    def here(self) -> int:
        """One process: the position of the item drawn last."""
        return self._stream.pos

    def delivered_here(self, pos: int | None = None) -> None:
        """One process: the item at `pos` (None: the one drawn last) reached the user."""
        rec = self.record
        rec.delivered.mark(self._stream.pos if pos is None else pos)
        rec.delivered.yielded += 1

    def stream_state_here(self, state: dict | None) -> None:
        """One process: the stateful stream's state after the batch just delivered."""
        if state is not None:
            self.record.streams.received[0] = state

    def finished(self) -> None:
        self.record.delivered.finished = True

    def restart_state(self, worker_id: int):
        """An IterableDataset: (whether a new worker in place of `worker_id` can continue its
        stream exactly, the state it restores: None for the one the epoch's workers started
        from). It can when the dead one delivered nothing yet (a fresh start, or the state the
        resume gave it, is its position), or when its dataset is stateful and sent its state
        with what it delivered."""
        rec = self.record
        if rec is None:
            return False, None
        s = rec.streams
        if worker_id in s.arrived:
            return True, s.arrived[worker_id]
        if worker_id not in s.arrived_from:
            return True, None
        return False, None

    def can_restart_stream(self, worker_id: int) -> bool:
        return self.restart_state(worker_id)[0]

    def pending(self) -> bool:
        """True when ``load_state_dict`` ran after this iterator began and no iterator has taken
        the state yet: this iterator must start over from it (``iter()`` before
        ``load_state_dict``)."""
        return self._point.pending is not None

    @property
    def loader(self):
        return self._loader()
