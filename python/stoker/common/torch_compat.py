"""Every private name of torch that stoker uses, in one place.

stoker subclasses torch's DataLoader and mirrors its multi-process iterator, so it leans on a few
names torch does not promise to keep: private modules, functions and classes, and two attributes
of torch's own objects (the one-process fetcher's ``dataset_iter``, the worker module's
``_worker_info``). They are all reached here, lazily where a worker may run without torch, so a
torch release that moves one breaks this file and nothing else. (Attributes that stoker's
subclasses of torch's iterators inherit, such as ``_sampler_iter`` or ``_base_seed``, are part of
subclassing and are used where the subclass is.) The tested range is ``TESTED_TORCH``
(``in_order``, which stoker honours, first shipped in torch 2.6).

A leaf: imports nothing of stoker. Safe from any thread.
"""

from __future__ import annotations

TESTED_TORCH = ">=2.6,<2.14"


def base_iterator():
    """``_BaseDataLoaderIter``: sampler iteration, ``_reset``, ``__next__`` and ``len``."""
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    return _BaseDataLoaderIter


def single_process_iterator():
    """``_SingleProcessDataLoaderIter``: num_workers=0, torch's own."""
    from torch.utils.data.dataloader import _SingleProcessDataLoaderIter

    return _SingleProcessDataLoaderIter


def collate_module():
    """``torch.utils.data._utils.collate``: ``collate``, ``default_collate_fn_map``,
    ``collate_tensor_fn`` (default_collate and default_convert are public)."""
    from torch.utils.data._utils import collate

    return collate


def fetcher_iterator(fetcher):
    """The live iterator of an IterableDataset inside torch's one-process fetcher."""
    return getattr(fetcher, "dataset_iter", None)


def set_fetcher_iterator(fetcher, iterator) -> None:
    fetcher.dataset_iter = iterator


def iterator_shut_down(iterator) -> bool:
    """torch's multi-process iterator (and its subclasses, torchdata's) shut its workers down."""
    return bool(getattr(iterator, "_shutdown", False))


def pin_memory(batch, device: str):
    from torch.utils.data._utils.pin_memory import pin_memory as _pin

    return _pin(batch, device)


def numpy_seed(base_seed: int, worker_id: int):
    """The NumPy seed torch's worker loop uses for this worker."""
    from torch.utils.data._utils.worker import _generate_state

    return _generate_state(base_seed, worker_id)


def is_datapipe(dataset) -> bool:
    try:
        from torch.utils.data import IterDataPipe, MapDataPipe
    except ImportError:
        return False
    return isinstance(dataset, (IterDataPipe, MapDataPipe))


def sharding_worker_init_fn(worker_init_fn, world_size: int, rank: int):
    """A DataPipe's worker_init_fn that first shards the pipe across ranks and workers, as
    torch's iterator wraps it."""
    import functools

    from torch.utils.data.dataloader import _sharding_worker_init_fn

    return functools.partial(_sharding_worker_init_fn, worker_init_fn, world_size, rank)


def with_shared_seed(dataset, seed: int):
    """An IterDataPipe whose random operations (shuffle) draw from `seed`: the same in every
    worker of an epoch, as torch does."""
    import torch
    from torch.utils.data.graph_settings import apply_random_seed

    rng = torch.Generator()
    rng.manual_seed(seed)
    return apply_random_seed(dataset, rng)


def set_torch_worker_info(worker_id: int, num_workers: int, seed: int, dataset):
    """Makes ``torch.utils.data.get_worker_info()`` answer in a stoker worker; returns the info.
    Raises ImportError without torch."""
    from torch.utils.data._utils import worker as torch_worker

    info = torch_worker.WorkerInfo(id=worker_id, num_workers=num_workers, seed=seed,
                                   dataset=dataset)
    torch_worker._worker_info = info
    return info
