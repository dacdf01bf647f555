"""stoker.DataLoader: torch's DataLoader with stoker's engine underneath.

It *is* a ``torch.utils.data.DataLoader`` (a subclass), so argument checking, samplers, ``len()``,
``persistent_workers`` and every ``isinstance`` check in user code behave exactly as torch's.
``num_workers=0`` loads in the main process as torch does. With workers, batches come from
stoker's supervised multi-process iterator.
"""

from __future__ import annotations

from typing import TypeVar

import torch.utils.data

from . import _options
from ._fetch import ITERABLE, MAP, Dropped, Fetcher, SkippedSample
from ._iterator import MultiProcessIter
from ._options import options_of, state_of
from ._state import stats_of
from ._torch_compat import single_process_iterator

T_co = TypeVar("T_co", covariant=True)


class DataLoader(torch.utils.data.DataLoader[T_co]):
    def __init__(
        self,
        dataset,
        batch_size=1,
        shuffle=None,
        sampler=None,
        batch_sampler=None,
        num_workers=0,
        collate_fn=None,
        pin_memory=False,
        drop_last=False,
        timeout=0,
        worker_init_fn=None,
        multiprocessing_context=None,
        generator=None,
        *,
        prefetch_factor=None,
        persistent_workers=False,
        pin_memory_device="",
        in_order=True,
        on_worker_death="restart",
        max_restarts=None,
        on_error="raise",
        max_retries=3,
        quarantine_after=2,
        hang_timeout=None,
        stall_notice=0.5,
        max_shared_memory="auto",
    ):
        options = _options.check({
            "on_worker_death": on_worker_death, "max_restarts": max_restarts,
            "on_error": on_error, "max_retries": max_retries,
            "quarantine_after": quarantine_after, "hang_timeout": hang_timeout,
            "stall_notice": stall_notice, "max_shared_memory": max_shared_memory,
        })
        # Keywords only: a framework that wraps DataLoader.__init__ (Lightning records the
        # arguments to re-create loaders) sees each argument under its name.
        super().__init__(
            dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler,
            batch_sampler=batch_sampler, num_workers=num_workers, collate_fn=collate_fn,
            pin_memory=pin_memory, drop_last=drop_last, timeout=timeout,
            worker_init_fn=worker_init_fn, multiprocessing_context=multiprocessing_context,
            generator=generator, prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers, pin_memory_device=pin_memory_device,
            in_order=in_order,
        )
        # Public attributes named like the arguments: frameworks that re-create a loader from
        # its attributes (Lightning, for a DistributedSampler) pass them back.
        for name, value in options.items():
            setattr(self, name, value)
        state_of(self)

    @property
    def _stoker_options(self) -> dict:
        """The options an iterator runs with now (max_shared_memory resolved)."""
        return options_of(self)

    @property
    def _stoker_state(self):
        return state_of(self)

    def __getstate__(self):
        # Pickles and copies at any time: a live iterator (persistent workers) stays with this
        # loader, and the copy gets its own records.
        d = dict(self.__dict__)
        d["_iterator"] = None
        d["_stoker_state"] = state_of(self).copy()
        return d

    def __setstate__(self, d):
        self.__dict__.update(d)

    @property
    def skipped(self) -> list[SkippedSample]:
        """Samples dropped by ``on_error="skip"`` or quarantine: ``.index``, ``.reason``,
        ``.epoch``."""
        return self._stoker_state.skipped

    @property
    def deaths(self) -> list:
        """Every worker death so far: worker id, pid, signal or exit code, cause, index."""
        return self._stoker_state.deaths

    def stats(self) -> dict:
        """What the loader is doing, as a JSON-serialisable dict: per worker (id, pid, state,
        index being loaded, samples, batches, restarts, seconds in __getitem__ / collate /
        encode / idle, RSS) and for the loader (batches yielded, seconds the loop waited for
        data and that share of its time, the data stall; slots and bytes mapped, held by the
        user and waiting; deaths with their causes; skipped and quarantined samples; which loader
        class and who served it: ``served_by`` is "stoker.DataLoader" or "stoker.enable()")."""
        return stats_of(self)

    def __iter__(self):
        # A persistent iterator that a worker's failure shut down cannot resume: start afresh.
        it = self.__dict__.get("_iterator")
        if it is not None and getattr(it, "_shutdown", False):
            self._iterator = None
        return super().__iter__()

    def _get_iterator(self):
        if self.num_workers == 0:
            if self.on_error == "raise":
                return super()._get_iterator()
            return _SingleProcessIter(self)
        self.check_worker_number_rationality()
        return MultiProcessIter(self)


class _PolicyFetcher:
    """torch's in-process fetcher, with the error policy applied sample by sample."""

    def __init__(self, loader, iterator):
        kind = ITERABLE if isinstance(loader.dataset, torch.utils.data.IterableDataset) else MAP
        opts = options_of(loader)
        self.fetcher = Fetcher(kind, loader.dataset, loader._auto_collation, loader.drop_last,
                               opts["on_error"], opts["max_retries"])
        self.collate_fn = loader.collate_fn
        self.state = state_of(loader)

    def fetch(self, index):
        try:
            data = self.fetcher.fetch(index)
        finally:
            for i, reason in self.fetcher.skipped:
                self.state.record_skip(SkippedSample(i, reason, self.state.epoch))
        return self.collate_fn(data)


class _SingleProcessIter(single_process_iterator()):
    """num_workers=0 with on_error="skip" or "retry"."""

    def __init__(self, loader):
        super().__init__(loader)
        state_of(loader).epoch += 1
        self._dataset_fetcher = _PolicyFetcher(loader, self)

    def _next_data(self):
        while True:
            try:
                return super()._next_data()
            except Dropped:
                continue


def _shared_memory_cap(value):
    return _options.shared_memory_cap(value)
