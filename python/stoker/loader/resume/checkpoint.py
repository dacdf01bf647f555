"""Checkpoint and resume: the loader's state, taken and loaded (docs/design/resume.md).

A state names the epoch under way, which of its sampler positions the user has received (a
prefix, plus the few beyond it that ``in_order=False`` delivered early), and what regenerates the
epoch's sampler order (``state.State``). Resuming replays the sampler of that epoch under the
saved RNG states and skips the positions already delivered, without loading them: batches that
were prefetched but not yielded are simply loaded again, and the order of the rest of the epoch,
and of the epochs after it, is the uninterrupted run's. Positions count what the sampler yields
(batches of indices), not workers' work, so a state resumes under any ``num_workers``, 0
included.

``get_state`` may be called at any time (between batches, before ``iter()``, after the epoch);
``set_state`` checks everything first and then makes the next epoch to begin (or a live
iterator's next batch) resume from it.

Thread contract: called by the thread that iterates the loader (as torch's iterators are).
"""

from __future__ import annotations

import torch

from ...common.indices import plain_index
from ...config.records import SkippedSample
from ...wire import stream_state
from . import elastic, rebatch, validate
from . import order as _order
from .position import point_of
from .state import State, check_digest, check_distributed, check_fingerprint, fingerprint


def get_state(loader, records, options) -> dict:
    """The loader's state now, as a plain dict (``State.to_dict``)."""
    point = point_of(records)
    st = State(
        loader=fingerprint(loader),
        epoch=records.epoch,
        generators_now=_order.capture_generators(loader),
        sampler_states_now=_order.capture_sampler_states(loader),
        seed=options.seed,
        skipped=tuple((plain_index(s.index), s.reason, s.epoch) for s in records.skipped),
        quarantined=tuple(sorted({plain_index(q) for q in records.quarantined}, key=repr)),
        distributed=elastic.describe(loader),
    )
    if point.pending is not None:  # loaded, not iterated yet: the same state again
        return _told(st.replace(**point.pending.position_part()), loader)
    rec = point.current
    if rec is None or rec.epoch != records.epoch:
        # No epoch begun in this process, or a finished state was loaded since: its workers'
        # states, which the next epoch's workers carry on from.
        return _told(st.replace(worker_states=tuple(sorted(point.carry.items())),
                                workers=point.carry_workers, **_next_epoch(loader, point)),
                     loader)
    d = rec.delivered
    out = st.replace(
        epoch=rec.epoch, finished=d.finished, position=d.prefix,
        delivered_after=tuple(sorted(d.extra)), batches_yielded=d.yielded,
        base_seed=rec.base_seed, torch_rng=rec.torch_rng, generators=rec.generators,
        sampler_epoch=rec.sampler_epoch, order=rec.order,
        worker_states=tuple((w, stream_state.plain(v))
                            for w, v in sorted(rec.streams.received.items())),
        last_worker=rec.streams.last_worker, workers=rec.workers,
        sampler_states=dict(rec.sampler_states), rebatch=rec.rebatch,
    )
    if d.finished:
        out = out.replace(**_next_epoch(loader, point))
    return _told(out, loader)


def _told(st: State, loader) -> dict:
    """The state as a document, saying whether its epoch had delivered every batch."""
    return st.replace(delivered_all=rebatch.all_delivered(st, loader)).to_dict()


def delivered_all(sd) -> bool | None:
    """Whether the epoch of state `sd` (a ``state_dict()``, of this release or an earlier one)
    had delivered every batch: True when it was saved after the loop ended (``finished``: a
    resume begins the next epoch) or inside the loop after the last batch (a resume finishes
    that epoch, yielding nothing); False when batches were left; None when the loader could not
    tell (a stream, a sampler without a length). For a list of ranks' states (an elastic
    resume): whether all of them had."""
    if isinstance(sd, (list, tuple)):
        each = [delivered_all(one) for one in sd]
        return None if None in each else all(each)
    st = State.from_dict(sd)
    validate.check_fields(st)
    return st.delivered_all


def epoch_length(loader, records) -> int | None:
    """``len(loader)`` while a resumed epoch whose batches are not the loader's own (another
    batch size, another world size) is loaded or under way: the batches received before the
    resume plus those of its rest. None: the loader's own length."""
    point = point_of(records)
    if point.pending is not None:
        return rebatch.length(point.pending, loader)
    rec = point.current
    if rec is not None and rec.epoch == records.epoch and not rec.delivered.finished:
        return rec.length
    return None


def _next_epoch(loader, point) -> dict:
    """Between epochs, without a loader generator: what the next epoch's base seed and
    shuffle draw from (torch's global RNG now; a persistent iterator that goes on draws no new
    base seed: its own). With a generator, ``generators_now`` says it all."""
    if point.next_rng is not None:  # loaded, not iterated yet: the same again
        return {"next_torch_rng": point.next_rng, "next_base_seed": point.next_seed}
    if loader.generator is not None:
        return {}
    it = loader.__dict__.get("_iterator")
    seed = None
    if loader.persistent_workers and it is not None and getattr(it, "reusable", None) \
            and it.reusable():
        seed = it.base_seed
    return {"next_torch_rng": _order.rng_bytes(torch.get_rng_state()), "next_base_seed": seed}


def set_state(loader, records, sd) -> None:
    """Loads `sd` (a state, or the list of all ranks' states of a saved job: elastic.py) into
    the loader: checked against it first (``StateMismatchError`` naming what differs)."""
    # Checks, most telling first: each field's type and range (naming the field), the loader's
    # fingerprint and the field ranges that depend on it, then the digest (a value in range but
    # not the one saved).
    resized = isinstance(sd, (list, tuple))
    if resized:
        states = [State.from_dict(one) for one in sd]
        for one, raw in zip(states, sd):
            validate.check_fields(one)
            check_digest(raw)
        state = elastic.merge(loader, states)
    else:
        state = State.from_dict(sd)
        validate.check_fields(state)
        check_distributed(state.distributed, elastic.describe(loader))
    here = fingerprint(loader)
    why = rebatch.why_not(state, here)
    check_fingerprint(state.loader, here, resized, rebatch.as_saved(state, here, loader, why),
                      why)
    validate.check_against(state, loader)
    if not resized:
        check_digest(sd)
    # Another batch size: the rest of the saved epoch in this loader's batches (rebatch.py).
    state = rebatch.convert(state, loader)
    point = point_of(records)
    records.set_skipped(SkippedSample(i, r, e) for i, r, e in state.skipped)
    records.quarantined = set(state.quarantined)
    point.current = None
    point.carry, point.carry_workers = {}, None
    point.next_rng, point.next_seed = None, None
    if state.finished:
        # The next iter() begins the next epoch, with the generators where the saved run had them.
        point.pending = None
        point.carry, point.carry_workers = dict(state.worker_states), state.workers
        point.next_rng, point.next_seed = state.next_torch_rng, state.next_base_seed
        records.epoch = state.epoch
        _order.set_generators(loader, state.generators_now)
        _order.set_sampler_states(loader, state.sampler_states_now)
        return
    records.epoch = state.epoch - 1  # the epoch that begins next is the saved one
    point.pending = state
    if state.sampler_epoch is not None:
        s = _order.epoch_sampler(loader)
        if s is not None:
            s.set_epoch(state.sampler_epoch)
