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
  ``finished()`` at the end of the epoch (a resumed epoch that yielded nothing says so, once, at
  WARNING: the state was saved inside the loop after its last batch);
- on a worker's death: ``restart_state(worker)``: can a new worker continue its stream, and from
  which state;
- ``pending()``: ``load_state_dict`` ran after this iterator began (it must start over).

``checkpoint.py`` reads the position (``state_dict``) and sets the pending state
(``load_state_dict``). Thread contract: the thread that iterates.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from dataclasses import dataclass, field

import torch
from torch.utils.data import IterableDataset

from ...common.errors import StateMismatchError
from ...wire import stream_state
from ...wire.events import StreamState, is_outcome
from . import order as _order
from . import rebatch
from .position import EpochPosition, SamplerStream, point_of

log = logging.getLogger("stoker")


@dataclass
class EpochStart:
    """What an iterator begins its epoch with."""

    sampler_iter: object  # the counted sampler stream, in place of the base iterator's
    base_seed: int
    # worker -> the state its worker restores (stream_state.py): a resume, or what persistent
    # workers carried out of a finished epoch that was loaded.
    stream_states: dict = field(default_factory=dict)
    first_worker: int | None = None  # the first task goes to this worker (a resumed epoch)
    discard: int = 0  # outcomes to load again and drop (a stream that cannot be positioned)
    ended: frozenset = frozenset()  # workers whose stream had ended when the state was taken


class Cursor:
    def __init__(self, loader, records):
        self._loader = weakref.ref(loader)
        self._records = records
        self._point = point_of(records)
        self.record: EpochPosition | None = None
        self._stream: SamplerStream | None = None
        self._sampler_states: dict | None = None  # taken by prepare_epoch
        # A loaded finished state's next epoch (drawing_base_seed): the base seed it draws, the
        # RNG its sampler's first draw replays under, whether num_workers=0's dataset has its
        # state back already.
        self._chosen_seed: int | None = None
        self._replay_rng: bytes | None = None
        self._main_restored = False

    # -- making the iterator ---------------------------------------------------------------------
    @contextlib.contextmanager
    def drawing_base_seed(self):
        """Around the base iterator's ``__init__``: when a resume is pending, the draw of the
        base seed leaves torch's global RNG as it was (the saved run drew it before the
        checkpoint). After a finished state was loaded (``ResumePoint.next_rng``: torch's
        global RNG when it was taken), the epoch's draws are the saved run's: natural when
        the RNG is as it was then (a dataset's restored state may have put it back:
        ``num_workers=0``'s dataset is restored first, as the saved run's was before its next
        ``iter()``), else made from the saved state, leaving the caller's RNG alone."""
        point = self._point
        loader = self._loader()
        self._chosen_seed = self._replay_rng = None
        kept = None
        if point.pending is None:
            self._restore_main_dataset(loader)
        if point.pending is not None:
            kept = torch.get_rng_state()
        elif point.next_rng is not None:
            saved = _order.rng_tensor(point.next_rng)
            if point.next_seed is not None or not torch.equal(torch.get_rng_state(), saved):
                kept = torch.get_rng_state()
                if point.next_seed is not None:  # persistent workers: no new base seed
                    self._chosen_seed, self._replay_rng = point.next_seed, point.next_rng
                else:
                    g = torch.Generator()
                    g.set_state(saved)
                    self._chosen_seed = int(
                        torch.empty((), dtype=torch.int64).random_(generator=g).item())
                    self._replay_rng = _order.rng_bytes(g.get_state())
        try:
            yield
        finally:
            if kept is not None:
                torch.set_rng_state(kept)

    def base_seed(self, drawn: int) -> int:
        """The base seed workers start with: the saved epoch's when a resume is pending (or
        the one a loaded finished state's next epoch draws)."""
        pending = self._point.pending
        if pending is not None:
            return pending.base_seed
        return drawn if self._chosen_seed is None else self._chosen_seed

    def _restore_main_dataset(self, loader) -> None:
        """num_workers=0: a loaded finished state's dataset state, put back before the next
        epoch draws anything (it may hold torch's global RNG, as the saved run's did)."""
        carried = self._carried(loader, warn=False) if loader.num_workers == 0 else {}
        mine = carried.get(0)
        if mine and "dataset" in mine:
            stream_state.restore_dataset(loader.dataset, {"dataset": mine["dataset"]})
            self._main_restored = True

    def starting_stream_states(self) -> dict:
        """What workers started before the first epoch begins restore (a pending resume, or
        the states a loaded finished epoch's workers carry into the next)."""
        loader = self._loader()
        pending = self._point.pending
        if pending is not None:
            return self._resumed(pending, loader, warn=False)
        return self._carried(loader, warn=False)

    def _resumed(self, pending, loader, warn: bool = True) -> dict:
        """The states a resume gives the workers: none for a stream that cannot be positioned
        (no dataset or iterator state: it is read again from its start)."""
        states = self._usable(pending.worker_states, pending.workers, loader, warn)
        if isinstance(loader.dataset, IterableDataset) and not any(
                stream_state.is_stream_state(v) for v in states.values()):
            return {}
        return states

    def _usable(self, states, workers, loader, warn: bool = True) -> dict:
        """The saved workers' states this loader's workers restore: all of them with the
        num_workers they were saved with. A map-style dataset's state saved without workers
        goes into the dataset every worker copies; other states are not restored, with a
        warning (the order of samples is exact; datasets' own states and the generators of
        augmentation start afresh)."""
        states = dict(states or ())
        n = loader.num_workers
        if not states or workers is None or workers == n:
            return states
        if (workers == 0 and not isinstance(loader.dataset, IterableDataset)
                and "dataset" in states.get(0, {})):
            stream_state.restore_dataset(loader.dataset, {"dataset": states[0]["dataset"]})
            return {}
        if warn:
            log.warning(
                "stoker: this state was saved with num_workers=%d and is resumed with %d: the "
                "samples and their order continue exactly, but the workers' own states (a "
                "dataset's state_dict, the random generators of augmentation under torch's "
                "seeding) start afresh. Resume with num_workers=%d for bit-identical values, "
                "or use seed=\"per_sample\", whose values do not depend on the workers.",
                workers, n, workers)
        return {}

    def _carried(self, loader, warn: bool = True) -> dict:
        """A finished epoch's states, loaded, for the next epoch's workers: persistent ones
        (and num_workers=0's dataset) carry their state from epoch to epoch; new workers of a
        non-persistent loader start from the dataset as it is in this process."""
        point = self._point
        if not point.carry or not (loader.persistent_workers or loader.num_workers == 0):
            return {}
        return self._usable(stream_state.into_next_epoch(point.carry), point.carry_workers,
                            loader, warn)

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
        carried = self._carried(loader) if pending is None else {}
        if self._main_restored:  # (drawing_base_seed put it back)
            carried = {w: rest for w, v in carried.items()
                       if (rest := {k: x for k, x in v.items() if k != "dataset"})}
        self._main_restored = False
        point.carry, point.carry_workers = {}, None
        point.next_seed = point.next_rng = None
        previous = point.current
        if pending is not None:
            self._apply(pending, rec, start, loader)
        else:
            rec.generators = _order.capture_generators(loader)
            rec.sampler_epoch = _order.sampler_epoch(loader)
            if self._replay_rng is not None:  # the sampler draws as the saved run's did
                rec.torch_rng, rec.replay = self._replay_rng, True
                self._replay_rng = None
            if carried:  # a loaded finished epoch: its workers' states go on
                start.stream_states = carried
                rec.streams.received = dict(carried)
            elif (previous is not None and previous.epoch == rec.epoch - 1
                  and (loader.persistent_workers or loader.num_workers == 0)):
                # Workers that live on keep their states: until a worker delivers in this
                # epoch, its state is the one it ended the last with.
                rec.streams.received = stream_state.into_next_epoch(previous.streams.received)
        rec.workers = loader.num_workers
        if rec.order is not None or rec.rebatch is not None:
            # An epoch resumed elastically (this rank's share of the rest) or under another
            # batch size (the rest of the sampler's order, in this loader's batches).
            sampler_iter = rebatch.batches_of(loader, rec.order, rec.rebatch)
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
        rec.rebatch = pending.rebatch
        rec.length = rebatch.length(pending, loader)
        rec.resumed_at = pending.batches_yielded
        now = _order.sampler_epoch(loader)
        if now != rec.sampler_epoch:
            raise StateMismatchError(
                f"stoker: the checkpoint was saved in the middle of an epoch whose sampler "
                f"had set_epoch({rec.sampler_epoch}), but the sampler is now at epoch {now}: "
                "the rest of that epoch would come from another order. Call "
                f"sampler.set_epoch({rec.sampler_epoch}) before iterating (or after "
                "load_state_dict, which sets it), as the saved run did."
            )
        states = self._resumed(pending, loader)
        d = rec.delivered
        iterable = isinstance(loader.dataset, IterableDataset)
        if iterable and not states:
            # Workers' streams cannot be positioned: they start afresh (as the saved epoch's
            # did) and the outcomes already received are loaded again and dropped.
            start.discard = pending.batches_yielded
            rec.replay = True
            return
        # Each worker continues from its own saved state; the tasks go round from the worker
        # after the one of the last batch received, as they would have.
        d.prefix = rec.skip_prefix = pending.position
        d.yielded = pending.batches_yielded
        if not iterable:
            d.extra = set(pending.delivered_after)
            rec.skip_extra = frozenset(d.extra)
        rec.streams.received = dict(states)
        rec.streams.last_worker = pending.last_worker
        start.stream_states = states
        start.ended = frozenset(w for w, v in states.items() if stream_state.ended(v))
        if states and loader.num_workers and pending.last_worker is not None:
            start.first_worker = (pending.last_worker + 1) % loader.num_workers
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

    def delivered(self, task: int, worker: int, outcome: bool = True) -> None:
        """Multi-process: the outcome of `task`, loaded by `worker`, reached the user (a batch,
        an error, or nothing when all its samples were skipped); `outcome` False: the task
        found its worker's stream ended (it counts as no batch)."""
        rec = self.record
        pos = rec.task_pos.pop(task, None)
        if pos is not None:
            rec.delivered.mark(pos)
            if outcome:
                rec.delivered.yielded += 1
        s = rec.streams
        sent = s.by_task.pop(task, None)
        if sent is not None:
            s.received[sent[0]] = sent[1]
        if outcome:
            s.last_worker = worker

    def passed(self, task: int) -> None:
        """Multi-process: `task` will never have an outcome (its worker's stream ended before
        it): its position counts as delivered."""
        rec = self.record
        pos = rec.task_pos.pop(task, None)
        if pos is not None:
            rec.delivered.mark(pos)
        rec.streams.by_task.pop(task, None)

    def here(self) -> int:
        """One process: the position of the item drawn last."""
        return self._stream.pos

    def delivered_here(self, pos: int | None = None) -> None:
        """One process: the item at `pos` (None: the one drawn last) reached the user."""
        rec = self.record
        rec.delivered.mark(self._stream.pos if pos is None else pos)
        rec.delivered.yielded += 1
        rec.streams.last_worker = 0

    def stream_state_here(self, state: dict | None) -> None:
        """One process: the dataset's (or stream's) state after the batch just delivered, or
        as the epoch begins or ends."""
        if state is not None:
            self.record.streams.received[0] = state

    def finished(self) -> None:
        rec = self.record
        assert rec is not None, "an epoch ends after it began"
        d = rec.delivered
        d.finished = True
        if rec.resumed_at is not None and d.yielded <= rec.resumed_at:
            # A state saved inside the loop after the epoch's last batch: its rest was empty.
            log.warning(
                "stoker: epoch %d yielded nothing: the state loaded was saved inside the loop "
                "after that epoch's last batch, so this iteration finished epoch %d. Iterate the "
                "loader again for epoch %d, or save the state after the loop ends (it then "
                "resumes with the next epoch); DataLoader.delivered_all(state) tells which a "
                "state is.", rec.epoch, rec.epoch, rec.epoch + 1)

    def restart_state(self, worker_id: int):
        """(whether a new worker in place of `worker_id` can continue its work exactly, the
        state it restores: None for the one the epoch's workers started from). A map-style
        dataset's worker always can (its tasks are re-issued), from the state after its last
        outcome if it sent one. A stream's can when the dead one delivered nothing yet (a fresh
        start, or the state the resume gave it, is its position), or when its dataset is
        stateful and sent its state with what it delivered."""
        rec = self.record
        if rec is None:
            return False, None
        s = rec.streams
        state = s.arrived.get(worker_id)
        if not isinstance(self._loader().dataset, IterableDataset):
            return True, state
        if state is not None and stream_state.is_stream_state(state):
            return True, state
        if worker_id not in s.arrived_from:
            return True, None
        return False, None

    def can_restart_stream(self, worker_id: int) -> bool:
        return self.restart_state(worker_id)[0]

    def loaded(self) -> bool:
        """A loaded state waits for the next epoch (mid-epoch, or a finished one whose workers'
        states carry on): workers already running cannot take it, new ones must."""
        p = self._point
        return p.pending is not None or bool(p.carry) or p.next_rng is not None

    def pending(self) -> bool:
        """True when ``load_state_dict`` ran after this iterator began and no iterator has taken
        the state yet: this iterator must start over from it (``iter()`` before
        ``load_state_dict``)."""
        return self._point.pending is not None

    @property
    def loader(self):
        return self._loader()
