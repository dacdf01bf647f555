"""get_worker_info(): the same object through stoker and torch.

Set once in each worker process, before the dataset runs; read from any thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._torch_compat import set_torch_worker_info

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
