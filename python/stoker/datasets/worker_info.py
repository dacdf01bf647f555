"""get_worker_info(): the same object through stoker and torch.

Set once in each worker process, before the dataset runs; read from any thread.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import Any

from ..common.torch_compat import set_torch_worker_info

_worker_info = None


@dataclass(frozen=True)
class WorkerInfo:
    """Used only when torch is not installed; otherwise torch's own WorkerInfo is returned."""

    id: int
    num_workers: int
    seed: int
    dataset: Any


def set_worker_info(worker_id: int, num_workers: int, seed: int, dataset) -> None:
    global _worker_info
    try:
        info = set_torch_worker_info(worker_id, num_workers, seed, dataset)
    except ImportError:
        info = WorkerInfo(worker_id, num_workers, seed, dataset)
    _worker_info = info


def get_worker_info():
    """In a worker: its id, num_workers, seed and its copy of the dataset. None in the main
    process. ``torch.utils.data.get_worker_info()`` returns the same object."""
    return _worker_info


# The seed of the sample being loaded (seed="per_sample"): a context variable, so each loading
# thread, and each coroutine of an async dataset (asyncio runs each in a context of its own),
# sees its own sample's.
_sample: contextvars.ContextVar = contextvars.ContextVar("stoker_sample_seed", default=None)
# The generators ``sample_generator()`` made for the sample being loaded ({device: generator}), in
# the same context as its seed: a new sample starts with none.
_generators: contextvars.ContextVar = contextvars.ContextVar("stoker_sample_generators",
                                                            default=None)


def set_sample_seed(seed) -> None:
    _sample.set(seed)
    _generators.set(None)


def sample_seed():
    """Under ``seed="per_sample"``, the seed of the sample this thread (or coroutine) is loading (from the base
    seed, the epoch and its index; the same whoever loads it, on whichever thread), else None.
    With ``threads_per_worker`` above 1 the global generators are shared by the loading threads,
    so draws from them are not reproducible; a generator made from this seed is::

        g = torch.Generator().manual_seed(stoker.sample_seed())
        rng = numpy.random.default_rng(stoker.sample_seed())
    """
    return _sample.get()


def sample_generator(device="cpu"):
    """Under ``seed="per_sample"``, a ``torch.Generator`` of the sample this thread (or coroutine)
    is loading, seeded from ``sample_seed()``; else None (so ``generator=`` falls back to torch's
    global generator, as without stoker). It is the sample's own: every call while that sample
    loads returns the same generator (its draws go on from one call to the next), the next
    sample gets a new one, and no other thread draws from it. Draws from it are the same
    whatever ``num_workers`` and ``threads_per_worker``::

        g = stoker.sample_generator()
        angle = torch.empty(()).uniform_(-10, 10, generator=g)
        i, j = torch.randint(0, 33, (2,), generator=g).tolist()

    `device`: where the generator lives ("cpu", or "cuda" for draws made on a GPU).
    """
    seed = _sample.get()
    if seed is None:
        return None
    made = _generators.get()
    if made is None:
        made = {}
        _generators.set(made)
    key = str(device)
    g = made.get(key)
    if g is None:
        import torch

        g = made[key] = torch.Generator(device=device).manual_seed(seed)
    return g
