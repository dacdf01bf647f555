"""Which samples of an epoch its batches hold, and which of them the user has received.

An epoch of a map-style loader is a base sequence of dataset indices (what its sampler yields, or
this rank's share of an explicit order: ``elastic.py``) cut into batches. Ordinarily batch ``j``
holds base positions ``[j*b, (j+1)*b)``. An epoch resumed under another batch size has a *layer*
(``State.rebatch``): the base positions delivered before the batch size changed, as
``{"prefix": p, "also": (...)}`` (positions ``[0, p)`` and the few beyond it that
``in_order=False`` had delivered early); its batches are those of the new size over the rest of
the base sequence, in its order (the last one short, or dropped under ``drop_last``). Resumed
again under a third size, the layer grows by what the second size's batches delivered.

Positions only, never the indices themselves: a layer is a few ints however large the dataset
(an elastic resume's explicit order is the one state that grows with the epoch).

Pure functions; any thread.
"""

from __future__ import annotations

import itertools

import numpy as np


def taken(layer) -> tuple[int, tuple]:
    """(prefix, also) of a layer; (0, ()) for none."""
    if layer is None:
        return 0, ()
    return int(layer["prefix"]), tuple(int(p) for p in layer["also"])


def rest_length(n: int, layer) -> int:
    """How many base positions of an `n`-long base sequence the layer leaves."""
    prefix, also = taken(layer)
    return max(0, n - min(prefix, n) - sum(1 for p in also if p < n))


def batch_count(rest: int, batch_size: int | None, drop_last: bool) -> int:
    """The batches `rest` samples make, as torch's BatchSampler cuts them."""
    if batch_size is None:
        return rest
    return rest // batch_size if drop_last else -(-rest // batch_size)


def delivered_mask(st, batch_size: int | None, n: int | None) -> np.ndarray:
    """The base positions the user received in the epoch of state `st` (batches of
    `batch_size` over the rest its layer leaves), as a boolean mask. The mask may be shorter
    than the base sequence (positions beyond it were not delivered) but never longer than `n`
    when `n` is known."""
    if st.finished:
        assert n is not None, "a finished epoch delivered its whole base sequence"
        return np.ones(n, dtype=bool)
    b = batch_size or 1
    prefix, also = taken(st.rebatch)
    batches = sorted(set(range(st.position)) | set(st.delivered_after))
    need = (batches[-1] + 1) * b if batches else 0  # rest positions the batches reach
    m = max(prefix + len(also) + need, (max(also) + 1) if also else 0)
    if n is not None:
        m = min(m, n)
    mask = np.zeros(m, dtype=bool)
    mask[: min(prefix, m)] = True
    inside = [p for p in also if p < m]
    mask[inside] = True
    rest = np.flatnonzero(~mask)
    chosen = np.zeros(len(rest), dtype=bool)
    chosen[: st.position * b] = True
    for j in st.delivered_after:
        chosen[j * b:(j + 1) * b] = True
    mask[rest[chosen]] = True
    return mask


def layer_of(mask: np.ndarray, beyond: tuple = ()) -> dict:
    """The layer that takes out the positions a mask marks (and `beyond`: marked positions
    past its end)."""
    undelivered = np.flatnonzero(~mask)
    prefix = int(undelivered[0]) if len(undelivered) else len(mask)
    also = [int(p) for p in np.flatnonzero(mask[prefix:]) + prefix]
    also += sorted(p for p in beyond if p >= len(mask))
    return {"prefix": prefix, "also": tuple(also)}


def batches(base, layer, batch_size: int, drop_last: bool):
    """The batches of the rest of `base` (an iterable of indices, iterated lazily and whole,
    so a sampler's generators end where the uninterrupted epoch leaves them)."""
    prefix, also = taken(layer)
    skip = set(also)
    it = iter(base)
    # The first `prefix` positions were delivered: drawn (they move the sampler's generators
    # as in the saved run) and dropped.
    for _ in itertools.islice(it, prefix):
        pass
    batch = []
    for pos, index in enumerate(it, start=prefix):
        if pos in skip:
            continue
        batch.append(index)
        if len(batch) == batch_size:
            yield batch
            batch = []
    if batch and not drop_last:
        yield batch
