"""Elastic resume: the states of a job's W ranks, loaded into one of W' ranks.

With torch's ``DistributedSampler``, an epoch is one global order: the (padded) permutation P
that every rank computes alike, of which rank r takes ``P[r::W]``. Each rank's state says which
of its batches its user received, so the states of all W ranks together say which positions of
P were delivered. The rest of P, in P's order, is the part of the epoch still owed; rank r' of W'
continues with ``rest[r'::W']``, and the epochs after it are the sampler's own again.

An epoch that was itself resumed elastically has an explicit global order (``order``: the rest,
padded for its world size), recorded in every rank's state, so a job can be resized again in
the middle of the same epoch.

Each saved rank's delivered positions are counted in that rank's own batches (the saved batch
size, over the rest its layer left if its epoch had been re-batched: ``layout.py``), so the new
job may have another batch size too: the rest is cut into its batches.

The rest is split as ``DistributedSampler`` splits: padded with its own first samples to a
multiple of W' (those few are delivered twice, as the sampler's own padding is), or, when the
sampler has ``drop_last=True``, cut to a multiple of W'. Each rank must get as many samples,
else the ranks of a DDP job would run different numbers of steps and hang.

Pure functions of states and a loader; the thread that iterates.
"""

from __future__ import annotations

import numpy as np
from torch.utils.data import BatchSampler, DistributedSampler

from ...common.errors import StateMismatchError
from . import layout


def describe(loader) -> dict | None:
    """What a state records of a ``DistributedSampler``: which rank of how many, and what
    decides its permutation. None for other samplers."""
    s = loader.sampler
    if not isinstance(s, DistributedSampler):
        return None
    return {"rank": s.rank, "num_replicas": s.num_replicas, "seed": s.seed,
            "shuffle": s.shuffle, "drop_last": s.drop_last}


def global_order(dist: dict, dataset, epoch, order: bytes | None) -> np.ndarray:
    """The epoch's global order P (rank r takes P[r::W]), as the sampler computes it."""
    if order is not None:
        return np.frombuffer(order, dtype=np.int64)
    w = dist["num_replicas"]
    parts = []
    for r in range(w):
        s = DistributedSampler(dataset, num_replicas=w, rank=r, shuffle=dist["shuffle"],
                               seed=dist["seed"], drop_last=dist["drop_last"])
        s.set_epoch(epoch if epoch is not None else 0)
        parts.append(list(s))
    out = np.empty(sum(len(p) for p in parts), dtype=np.int64)
    for r, p in enumerate(parts):
        out[r::w] = p
    return out


def split(order: np.ndarray, num_replicas: int, drop_last: bool) -> np.ndarray:
    """`order` made a multiple of `num_replicas` long, as DistributedSampler does."""
    n = len(order)
    if n % num_replicas == 0:
        return order
    if drop_last:
        return order[: n - n % num_replicas]
    pad = num_replicas - n % num_replicas
    reps = -(-pad // n) if n else 0
    return np.concatenate([order] + [order] * reps)[: n + pad]


def batches(rank_list, loader):
    """The batches the loader's batch sampler would make from this rank's list of indices."""
    items = [int(i) for i in rank_list]
    if loader.batch_size is None:
        return iter(items)
    return iter(BatchSampler(items, loader.batch_size, loader.drop_last))


def merge(loader, states):
    """The state (``state.State``) this rank resumes from, given the states of all ranks of the
    saved job."""
    here = describe(loader)
    if here is None:
        raise StateMismatchError(
            "stoker: load_state_dict was given a list of states (one per rank of a saved job), "
            f"which resumes a loader whose sampler is torch's DistributedSampler; this loader's "
            f"sampler is a {type(loader.sampler).__name__}. Load this rank's own state (a dict) "
            "instead, or use DistributedSampler."
        )
    bs = loader.batch_sampler
    if bs is not None and type(bs) is not BatchSampler:
        raise StateMismatchError(
            f"stoker: an elastic resume rebuilds this rank's batches with torch's BatchSampler, "
            f"but the loader has a custom batch_sampler ({type(bs).__name__}): its batches of "
            "the rest of the epoch cannot be derived. Resume on the saved number of ranks "
            "(each rank its own state), or use batch_size= with DistributedSampler."
        )
    states = list(states)
    for i, st in enumerate(states):
        if st.distributed is None:
            raise StateMismatchError(
                f"stoker: state {i} of the list was not saved by a loader with a "
                "DistributedSampler (it records no rank): an elastic resume needs the states of "
                "all ranks of the saved job, each from loader.state_dict()."
            )
    saved = [st.distributed for st in states]
    w = saved[0]["num_replicas"]
    ranks = sorted(d["rank"] for d in saved)
    if ranks != list(range(w)) or any(d["num_replicas"] != w for d in saved):
        raise StateMismatchError(
            f"stoker: an elastic resume needs the states of all ranks of the saved job, once "
            f"each; got ranks {[d['rank'] for d in saved]} of a {w}-rank job. Gather every "
            "rank's loader.state_dict() (torch.distributed.all_gather_object) when saving, or "
            "load each rank's file."
        )
    states = sorted(states, key=lambda s: s.distributed["rank"])
    first = states[0]
    for st in states[1:]:
        diffs = [k for k in ("epoch", "sampler_epoch", "order")
                 if getattr(st, k) != getattr(first, k)]
        diffs += [k for k in ("seed", "shuffle", "drop_last")
                  if st.distributed[k] != first.distributed[k]]
        diffs += [k for k in ("batch_size",) if st.loader.get(k) != first.loader.get(k)]
        if diffs:
            raise StateMismatchError(
                f"stoker: the ranks' states disagree on {', '.join(diffs)} (rank 0 and rank "
                f"{st.distributed['rank']}): they were not saved at the same point of one "
                "job. Use the states of one checkpoint."
            )
    b = first.loader.get("batch_size")
    if b is not None and (not isinstance(b, int) or isinstance(b, bool) or b < 1):
        raise StateMismatchError(
            f"stoker: the saved job's batch_size is {b!r}, not a batch size: the checkpoint was "
            "edited or made by another tool. Nothing was loaded.")
    for k in ("seed", "shuffle", "drop_last"):
        if first.distributed[k] != here[k]:
            raise StateMismatchError(
                f"stoker: the saved job's DistributedSampler had {k}={first.distributed[k]!r}"
                f", this one has {k}={here[k]!r}: the rest of the epoch would be another set of "
                "samples. Build the sampler as the saved job did."
            )
    merged = first.replace(
        distributed=dict(here),
        skipped=tuple(s for st in states for s in st.skipped),
        quarantined=tuple(sorted({q for st in states for q in st.quarantined}, key=repr)),
        batches_yielded=0, position=0, delivered_after=(), rebatch=None, delivered_all=None,
        # Another rank's share goes to each rank: no worker continues one of the saved ones.
        worker_states=(), last_worker=None, workers=None)
    if all(st.finished for st in states):
        return merged.replace(finished=True, order=None)
    order = global_order(first.distributed, loader.dataset, first.sampler_epoch, first.order)
    delivered = np.zeros(len(order), dtype=bool)
    for r, st in enumerate(states):
        n_r = len(range(r, len(order), w))
        # (positions counted in the batches of the loader that saved it, over the rest its own
        # layer left if that epoch had been re-batched: not in this loader's batch size)
        j = np.flatnonzero(layout.delivered_mask(st, st.loader.get("batch_size"), n_r))
        delivered[r + j * w] = True
    rest = split(order[~delivered], here["num_replicas"], here["drop_last"])
    # DistributedSampler draws from its own seed, not torch's RNG.
    return merged.replace(finished=False, order=rest.astype(np.int64).tobytes(), torch_rng=None)


def share(order: bytes, num_replicas: int, rank: int) -> list[int]:
    """This rank's part of an explicit global order (recorded by an elastic resume)."""
    g = np.frombuffer(order, dtype=np.int64)
    if len(g) % num_replicas:
        raise StateMismatchError(
            f"stoker: the rest of this epoch was split for another number of ranks "
            f"({len(g)} samples do not divide among {num_replicas}): it was resumed elastically "
            "and then loaded on a job of another size, one rank's state at a time. Pass the "
            "states of all ranks, as a list, to load_state_dict."
        )
    return g[rank::num_replicas].tolist()
