"""Checking a loaded state field by field, before anything changes.

A checkpoint can be truncated, edited by hand, made by another tool or release, or crafted. Every
field's type and range is checked, against the loader it is loaded into where the range depends
on it (the batches of an epoch, its workers, its generators and samplers); what does not fit
raises ``StateMismatchError`` naming the field, what it holds and what was expected, and the
loader is left as it was. A state that passes resumes the saved run exactly, or is the same
saved run's state with only informative fields changed.

Pure functions; the thread that iterates (they build nothing but error messages).
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import BatchSampler, DistributedSampler, IterableDataset

from ...common import rng_state
from ...common.errors import StateMismatchError
from ...common.plain import is_plain
from . import order as _order
from . import rebatch
from .state import State

_INT64 = (-(1 << 63), (1 << 63) - 1)


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _seq(v) -> bool:
    return isinstance(v, (tuple, list))


def _short(v, limit: int = 120) -> str:
    try:
        r = repr(v)
    except Exception:
        r = f"<{type(v).__name__}>"
    return r if len(r) <= limit else r[: limit - 3] + "..."


def _refuse(name: str, value, expected: str):
    raise StateMismatchError(
        f"stoker: this state's {name} is {_short(value)} ({type(value).__name__}); expected "
        f"{expected}. The checkpoint was edited, truncated or made by another tool: nothing "
        "was loaded (the loader is as it was). Use a state from loader.state_dict(), or start "
        "afresh without load_state_dict.")


def _expect(ok: bool, name: str, value, expected: str) -> None:
    if not ok:
        _refuse(name, value, expected)


def check_fields(st: State) -> None:
    """What holds for any state, whatever loader it is loaded into."""
    _expect(isinstance(st.loader, dict), "loader", st.loader, "the saved loader's fingerprint (a dict)")
    _expect(isinstance(st.finished, bool), "finished", st.finished, "True or False")
    _expect(_int(st.epoch) and st.epoch >= (0 if st.finished else 1), "epoch", st.epoch,
            "an int >= 1 (>= 0 for a finished epoch)")
    _expect(_int(st.position) and st.position >= 0, "position", st.position, "an int >= 0")
    _expect(_seq(st.delivered_after) and all(_int(p) for p in st.delivered_after)
            and len(set(st.delivered_after)) == len(st.delivered_after)
            and all(p > st.position for p in st.delivered_after),
            "delivered_after", st.delivered_after,
            "distinct int positions beyond position")
    _expect(_int(st.batches_yielded) and st.batches_yielded >= 0, "batches_yielded",
            st.batches_yielded, "an int >= 0")
    _expect(_int(st.base_seed) and _INT64[0] <= st.base_seed <= _INT64[1], "base_seed",
            st.base_seed, "an int64")
    rng_bytes = len(torch.get_rng_state())
    _expect(st.torch_rng is None or (isinstance(st.torch_rng, bytes)
                                     and len(st.torch_rng) == rng_bytes),
            "torch_rng", st.torch_rng, f"None or torch's RNG state ({rng_bytes} bytes)")
    for name in ("generators", "generators_now"):
        v = getattr(st, name)
        _expect(_seq(v) and all(isinstance(g, bytes) for g in v), name, v,
                "a tuple of generator states (bytes)")
    _expect(st.sampler_epoch is None or (_int(st.sampler_epoch) and st.sampler_epoch >= 0),
            "sampler_epoch", st.sampler_epoch, "None or an int >= 0")
    _expect(st.seed in (None, "per_sample"), "seed", st.seed, "None or 'per_sample'")
    _expect(_seq(st.skipped) and all(
        _seq(s) and len(s) == 3 and is_plain(s[0]) and isinstance(s[1], str) and _int(s[2])
        and s[2] >= 0 for s in st.skipped),
        "skipped", st.skipped, "(index, reason, epoch) triples of plain data")
    _expect(_seq(st.quarantined) and all(is_plain(q) and _hashable(q) for q in st.quarantined),
            "quarantined", st.quarantined, "a tuple of plain dataset indices")
    _check_distributed_fields(st.distributed)
    _expect(st.order is None or (isinstance(st.order, bytes) and len(st.order) % 8 == 0),
            "order", st.order, "None or an int64 order (bytes, 8 per sample)")
    _expect(_seq(st.worker_states) and all(
        _seq(p) and len(p) == 2 and _int(p[0]) and p[0] >= 0 and is_plain(p[1])
        for p in st.worker_states)
        and len({p[0] for p in st.worker_states}) == len(st.worker_states),
        "worker_states", st.worker_states, "(worker id, plain state) pairs, one per worker")
    for w, state in st.worker_states:
        _check_worker_state(w, state)
    _expect(st.last_worker is None or (_int(st.last_worker) and st.last_worker >= 0),
            "last_worker", st.last_worker, "None or a worker id")
    _expect(st.workers is None or (_int(st.workers) and st.workers >= 0), "workers",
            st.workers, "None or the num_workers the states were taken with")
    _expect(st.next_torch_rng is None or (isinstance(st.next_torch_rng, bytes)
                                          and len(st.next_torch_rng) == rng_bytes),
            "next_torch_rng", st.next_torch_rng, f"None or torch's RNG state ({rng_bytes} bytes)")
    _expect(st.next_base_seed is None or (_int(st.next_base_seed)
                                          and _INT64[0] <= st.next_base_seed <= _INT64[1]),
            "next_base_seed", st.next_base_seed, "None or an int64")
    for name in ("sampler_states", "sampler_states_now"):
        v = getattr(st, name)
        _expect(isinstance(v, dict) and all(isinstance(k, str) for k in v) and is_plain(v),
                name, v, "a dict of samplers' states (plain data)")
    _check_layer(st.rebatch)
    _expect(st.delivered_all in (None, True, False), "delivered_all", st.delivered_all,
            "None, True or False")


def _check_layer(v) -> None:
    if v is None:
        return
    ok = isinstance(v, dict) and set(v) == {"prefix", "also"} and _int(v["prefix"]) \
        and v["prefix"] >= 0 and _seq(v["also"]) and all(_int(p) for p in v["also"]) \
        and len(set(v["also"])) == len(v["also"]) and all(p > v["prefix"] for p in v["also"])
    _expect(ok, "rebatch", v, "None or {prefix: an int >= 0, also: distinct int positions "
            "beyond prefix} (the positions an epoch had delivered before its batch size "
            "changed)")


_WORKER_KEYS = {"dataset", "iterator", "self", "position", "rng", "ended"}


def _check_worker_state(w: int, state) -> None:
    """A worker's state as ``wire.stream_state.capture`` takes it (a state saved by stoker
    0.1 may be another plain value: it is the dataset's, passed on as it is)."""
    if not isinstance(state, dict) or not set(state) <= _WORKER_KEYS:
        return
    name = f"worker_states (worker {w})"
    pos = state.get("position", 0)
    _expect(_int(pos) and pos >= 0, name, state, "a stream position (an int >= 0)")
    _expect(state.get("ended", False) in (True, False), name, state,
            "'ended' True or False")
    if state.get("rng") is not None:
        why = rng_state.problem(state["rng"])
        _expect(why is None, name, state["rng"], f"the worker's random generators: {why}")


def _hashable(v) -> bool:
    try:
        hash(v)
        return True
    except TypeError:
        return False


def _check_distributed_fields(d) -> None:
    if d is None:
        return
    keys = {"rank", "num_replicas", "seed", "shuffle", "drop_last"}
    ok = (isinstance(d, dict) and set(d) == keys and _int(d["num_replicas"])
          and d["num_replicas"] >= 1 and _int(d["rank"]) and 0 <= d["rank"] < d["num_replicas"]
          and _int(d["seed"]) and isinstance(d["shuffle"], bool)
          and isinstance(d["drop_last"], bool))
    _expect(ok, "distributed", d,
            "None or {rank, num_replicas, seed, shuffle, drop_last} of a DistributedSampler")


def check_against(st: State, loader) -> None:
    """What depends on the loader the state is loaded into (after ``check_fields``)."""
    ds = loader.dataset
    iterable = isinstance(ds, IterableDataset)
    workers = max(1, loader.num_workers)
    n_gen = len(_order.generators(loader))
    sizes = [len(g.get_state()) for _, g in _order.generators(loader)]
    for name in ("generators", "generators_now") if not st.finished else ("generators_now",):
        v = getattr(st, name)
        _expect(len(v) == n_gen and all(len(g) == n for g, n in zip(v, sizes)), name,
                v, f"the states of this loader's {n_gen} generator(s) ({sizes} bytes)")
    if not st.finished:
        has_epoch = _order.epoch_sampler(loader) is not None
        _expect((st.sampler_epoch is not None) == has_epoch, "sampler_epoch", st.sampler_epoch,
                "an int (this loader's sampler has set_epoch)" if has_epoch else
                "None (this loader's sampler has no set_epoch)")
    paths = {p for p, _ in _order.stateful_samplers(loader)}
    for name in ("sampler_states", "sampler_states_now"):  # a finished epoch resumes from _now
        v = getattr(st, name)
        _expect(set(v) <= paths, name, v,
                f"states of this loader's stateful samplers ({sorted(paths) or 'none'})")
    if paths and not st.finished:
        _expect(set(st.sampler_states) == paths, "sampler_states", st.sampler_states,
                f"the state of each of this loader's stateful samplers ({sorted(paths)}) as the "
                "saved epoch began")
    if iterable:
        _expect(all(p[0] < workers for p in st.worker_states), "worker_states",
                st.worker_states, f"states of workers 0..{workers - 1}")
        _expect(st.last_worker is None or st.last_worker < workers, "last_worker",
                st.last_worker, f"None or a worker id below {workers}")
    else:  # a map-style dataset's states are used only with the num_workers they came from
        saved = max(1, st.workers) if st.workers is not None else 0
        _expect(all(p[0] < saved for p in st.worker_states), "worker_states",
                st.worker_states, f"states of workers 0..{saved - 1} (workers: {st.workers})"
                if saved else "nothing (no num_workers saved with them)")
        _expect(st.last_worker is None or st.last_worker < max(1, saved), "last_worker",
                st.last_worker, f"None or a worker id below {max(1, saved)}")
    if st.order is not None:
        s = loader.sampler
        _expect(isinstance(s, DistributedSampler), "order", st.order,
                "None (an explicit order needs this loader's sampler to be a DistributedSampler)")
        g = np.frombuffer(st.order, dtype=np.int64)
        n = len(ds)
        _expect(bool(len(g) == 0 or (g.min() >= 0 and g.max() < n)), "order", st.order,
                f"dataset indices in [0, {n})")
    if st.rebatch is not None and not st.finished:
        samples = rebatch.base_length(st.order, loader)
        p, also = st.rebatch["prefix"], st.rebatch["also"]
        _expect(not iterable and isinstance(loader.batch_sampler, BatchSampler), "rebatch",
                st.rebatch, "None (this loader is not batched by torch's BatchSampler, "
                "which a re-batched epoch needs)")
        _expect(samples is None or (p + len(also) <= samples
                                    and all(q < samples for q in also)),
                "rebatch", st.rebatch, f"positions within the epoch's {samples} samples")
    if not st.finished and not iterable:
        batches = _batches_in_epoch(st, loader)
        if batches is not None:
            _expect(st.position <= batches, "position", st.position,
                    f"at most the {batches} batches of the saved epoch")
            _expect(all(p < batches for p in st.delivered_after), "delivered_after",
                    st.delivered_after, f"positions below the epoch's {batches} batches")


def _batches_in_epoch(st: State, loader) -> int | None:
    """How many batches the saved epoch has on this loader, in the batches of the loader that
    saved it (None when it has no length)."""
    return rebatch.epoch_batches(st.order, st.rebatch, loader,
                                 st.loader.get("batch_size", loader.batch_size))
