"""Resuming under another batch size, and how many batches a resumed epoch has.

A map-style loader batched by torch's ``BatchSampler`` (``batch_size=``) resumes a state saved
with another batch size: the samples of the saved epoch that the user had not received, in the
saved order, cut into batches of the new size (the last one short, or dropped under
``drop_last=True``, as torchdata's ``StatefulDataLoader`` does); the epochs after it are the new
loader's own. ``convert`` turns the loaded state into one of the new loader: its delivered
batches become a layer of delivered base positions (``layout.py``), and the position starts at
0 in batches of the new size, so a state saved inside that epoch resumes again, under a third
size too.

A stream (an IterableDataset) is batched in each worker, from its own copy: a worker whose
stream has a state of its own (``state_dict``/``load_state_dict``) continues from the item after
its last batch received, whatever the batch size, so such a state resumes too. What stoker
cannot position in samples is refused with the reason (``why_not``): a stream without state (it
is read again and the batches already received dropped, counted in the saved size), a dataset
that makes its own batches (``batch_size=None``) and a custom ``batch_sampler`` (stoker does not
know which samples its batches hold).

The length of a resumed epoch (``len(loader)`` while it runs): the batches received before the
resume plus the batches of the rest, for an epoch whose batches are not the loader's own (another
batch size, or another world size: ``elastic.py``).

Pure functions of states and a loader; the thread that iterates.
"""

from __future__ import annotations

import torch.utils.data
from torch.utils.data import IterableDataset

from ...wire import stream_state
from . import elastic, layout


def _is_batch_size(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _batching(fp: dict) -> str:
    """How a fingerprinted loader makes its batches, in words."""
    bs, sampler = fp.get("batch_size"), fp.get("batch_sampler")
    if bs is not None:
        return f"batch_size={bs!r}"
    if sampler:
        return f"a custom batch_sampler ({sampler})"
    return "batch_size=None (each item of the dataset is a batch it made itself)"


def why_not(st, here: dict) -> str | None:
    """None when state `st` (checked field by field) may resume on a loader fingerprinted
    `here` though their batch sizes differ (or they do not differ); else the reason, for the
    refusal."""
    saved = st.loader
    b0, b1 = saved.get("batch_size"), here.get("batch_size")
    if b0 == b1:
        if (b0 is None and saved.get("batch_sampler")
                and saved.get("batch_sampler") == here.get("batch_sampler")
                and saved.get("batches_per_epoch") != here.get("batches_per_epoch")):
            return ("(a custom batch_sampler: stoker replays it as it was saved and cannot "
                    "re-batch the rest of its epoch, because it does not know which samples its "
                    "batches hold. Resume with the batch sampler built as the saved run built "
                    "it, or use batch_size= with a sampler: torch's BatchSampler, whose rest "
                    "stoker re-batches under another batch size)")
        return None
    if b0 is not None and not _is_batch_size(b0):
        return (f"(the saved batch_size is {b0!r}, not a batch size: the checkpoint was edited "
                "or made by another tool)")
    if b0 is None or b1 is None:
        return (f"(the saved loader had {_batching(saved)}, this one has {_batching(here)}: "
                "stoker re-batches the rest of an epoch only between batch sizes of torch's "
                "BatchSampler, because it does not know which samples a dataset's own batches "
                "or a custom batch_sampler's hold. Resume with the batching the state was saved "
                "with, finish that epoch, then change it)")
    if here.get("dataset_kind") != "iterable" or st.finished:
        return None
    positioned = any(stream_state.is_stream_state(v) for _, v in st.worker_states)
    if positioned or (st.batches_yielded == 0 and st.position == 0):
        return None
    k = st.batches_yielded
    got = "the batch" if k == 1 else f"the {k} batches"
    return (f"(this IterableDataset has no state of its own: stoker resumes it by reading each "
            f"worker's stream again and dropping {got} you had received, and those are {b0} samples each, which a loader with batch_size={b1} "
            f"does not know how to drop. Resume with batch_size={b0} until the epoch ends, or "
            "give the dataset (or the iterator its __iter__ returns) state_dict() and "
            "load_state_dict(state), so that each worker's stream continues from its position "
            "under any batch size)")


def as_saved(st, here: dict, loader, why: str | None) -> dict | None:
    """The fingerprint `here` of `loader` as it would be with the batch size `st` was saved
    with, when the rest of its epoch may be re-batched (`why` is None); else None. Its
    sampler must yield as many samples as the saved one's did (the saved batches per epoch)."""
    b0 = st.loader.get("batch_size")
    if why is not None or b0 == here.get("batch_size"):
        return None
    batches = here.get("batches_per_epoch")
    if here.get("dataset_kind") == "map":
        n = base_length(None, loader)
        batches = None if n is None else layout.batch_count(n, b0, loader.drop_last)
    return {**here, "batch_size": b0, "batches_per_epoch": batches}


def convert(st, loader):
    """State `st`, saved mid-epoch with another batch size, as a state of `loader`: what it
    had delivered becomes a layer of base positions, and its position is 0 in batches of the
    loader's size. Other states are returned as they are."""
    b_saved = st.loader.get("batch_size")
    if (st.finished or isinstance(loader.dataset, IterableDataset)
            or b_saved == loader.batch_size):
        return st
    n = base_length(st.order, loader)
    _, also = layout.taken(st.rebatch)
    mask = layout.delivered_mask(st, b_saved, n)
    return st.replace(rebatch=layout.layer_of(mask, also), position=0, delivered_after=())


def base_length(order: bytes | None, loader) -> int | None:
    """How many indices the epoch's base sequence has: this rank's share of an explicit order,
    else what the loader's sampler yields (None when it has no length)."""
    if order is not None:
        s = loader.sampler
        return len(elastic.share(order, s.num_replicas, s.rank))
    try:
        return len(loader.sampler)
    except TypeError:
        return None


def epoch_batches(order, layer, loader, batch_size) -> int | None:
    """How many batches of `batch_size` the epoch described by (`order`, `layer`) has on
    `loader` (None when its sampler has no length)."""
    if order is None and layer is None and batch_size == loader.batch_size:
        try:
            return torch.utils.data.DataLoader.__len__(loader)  # torch's own count
        except TypeError:
            return None
    n = base_length(order, loader)
    if n is None:
        return None
    return layout.batch_count(layout.rest_length(n, layer), batch_size, loader.drop_last)


def batches_of(loader, order, layer):
    """The index batches of an epoch whose batches are not the sampler's own: this rank's
    share of an explicit order and/or the rest a layer leaves, in the loader's batch size."""
    base = loader.sampler
    if order is not None:
        s = loader.sampler
        base = elastic.share(order, s.num_replicas, s.rank)
        if layer is None:
            return elastic.batches(base, loader)
    return layout.batches(base, layer, loader.batch_size, loader.drop_last)


def length(st, loader) -> int | None:
    """``len(loader)`` for the epoch state `st` resumes (mid-epoch), when its batches are not
    the loader's own: the batches received before plus those of the rest. None otherwise."""
    if st.finished or (st.order is None and st.rebatch is None):
        return None
    if isinstance(loader.dataset, IterableDataset):
        return None
    count = epoch_batches(st.order, st.rebatch, loader, loader.batch_size)
    if count is None:
        return None
    return st.batches_yielded + max(0, count - st.position - len(st.delivered_after))


def all_delivered(st, loader) -> bool | None:
    """Whether the epoch of state `st` (a state of `loader`) had delivered every batch: True
    for a finished epoch, and for one saved inside the loop after its last batch (it resumes
    with that epoch's empty rest); None when the loader cannot tell (a stream, a sampler
    without a length)."""
    if st.finished:
        return True
    if isinstance(loader.dataset, IterableDataset):
        return None
    count = epoch_batches(st.order, st.rebatch, loader, loader.batch_size)
    return None if count is None else st.position >= count
