"""stoker.DataLoader: torch's DataLoader with stoker's engine underneath.

It *is* a ``torch.utils.data.DataLoader`` (a subclass), so argument checking, samplers, ``len()``,
``persistent_workers`` and every ``isinstance`` check in user code behave exactly as torch's.
``num_workers=0`` loads in the main process as torch does. With workers, batches come from
stoker's supervised multi-process iterator.
"""

from __future__ import annotations

import copy
from typing import TypeVar

import torch.utils.data

from . import _autotune, _checkpoint, _options, _seeding
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
        seed=None,
        autotune=False,
        autotune_prefetch=False,
    ):
        # num_workers="auto": torch checks for an int, so the bound goes to torch and the
        # iterator tunes how many of those workers take tasks (_autotune.py).
        if isinstance(num_workers, str) and num_workers == "auto":
            num_workers, autotune = _autotune.resolve_num_workers(num_workers), True
        # prefetch_factor="auto": torch gets where the depth starts (its own default), and the
        # iterator tunes it. With num_workers=0 there is nothing to tune (torch wants None).
        if isinstance(prefetch_factor, str) and prefetch_factor == "auto":
            prefetch_factor = _autotune.START_DEPTH if num_workers else None
            autotune_prefetch = True
        options = _options.check({
            "on_worker_death": on_worker_death, "max_restarts": max_restarts,
            "on_error": on_error, "max_retries": max_retries,
            "quarantine_after": quarantine_after, "hang_timeout": hang_timeout,
            "stall_notice": stall_notice, "max_shared_memory": max_shared_memory,
            "seed": seed, "autotune": autotune, "autotune_prefetch": autotune_prefetch,
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
        if "_stoker_resume" in d:  # the checkpoint tracker (_checkpoint.py): the copy's own
            d["_stoker_resume"] = copy.deepcopy(d["_stoker_resume"])
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

    # -- checkpoint and resume (_checkpoint.py) --------------------------------------------------
    def state_dict(self) -> dict:
        """Where this loader is: the epoch, the batches of it the user has received, what
        regenerates its order, the skipped samples. Callable at any time; a plain dict with a
        ``version`` (``torch.save`` and ``torch.distributed.checkpoint`` take it)."""
        return _checkpoint.state_dict(self)

    def load_state_dict(self, state_dict: dict) -> None:
        """Makes the next iteration continue with the first batch the saved loader had not
        yielded (under any ``num_workers``); raises ``StateMismatchError`` naming what differs
        when the state comes from a loader that orders samples differently. With a
        ``DistributedSampler``, a list of the states of all ranks of the saved job resumes on
        another number of ranks: the rest of the epoch is split among them (_elastic.py)."""
        _checkpoint.load_state_dict(self, state_dict)

    def _get_iterator(self):
        if self.num_workers == 0:
            return _SingleProcessIter(self)
        self.check_worker_number_rationality()
        return MultiProcessIter(self)


class _PolicyFetcher:
    """torch's in-process fetcher, with the error policy applied sample by sample and, under
    seed="per_sample", each sample's generators seeded before it is loaded."""

    def __init__(self, loader, iterator, seeder=None):
        kind = ITERABLE if isinstance(loader.dataset, torch.utils.data.IterableDataset) else MAP
        opts = options_of(loader)
        self.fetcher = Fetcher(kind, loader.dataset, loader._auto_collation, loader.drop_last,
                               opts["on_error"], opts["max_retries"], seeder)
        self.collate_fn = loader.collate_fn
        self.state = state_of(loader)
        self.seeding = seeder is not None

    def fetch(self, index):
        if not self.seeding:
            return self._fetch(index)
        with _seeding.KeptGenerators():  # collate draws as in a worker: after the last sample
            return self._fetch(index)

    def _fetch(self, index):
        try:
            data = self.fetcher.fetch(index)
        finally:
            for i, reason in self.fetcher.skipped:
                self.state.record_skip(SkippedSample(i, reason, self.state.epoch))
        return self.collate_fn(data)


class _SingleProcessIter(single_process_iterator()):
    """num_workers=0: torch's iterator, with the error policy (on_error="skip" or "retry"),
    per-sample seeding, and the position a checkpoint records."""

    def __init__(self, loader):
        kept = _checkpoint.before_iterator(loader)
        super().__init__(loader)
        self._loader_state = state_of(loader)
        self._cursor = _checkpoint.attach(loader, self, kept)
        self._seeder = _seeding.seeder_for(loader, self._base_seed, 0)
        if options_of(loader)["on_error"] != "raise" or self._seeder is not None:
            self._dataset_fetcher = _PolicyFetcher(loader, self, self._seeder)
        self._begin_epoch()

    def _begin_epoch(self):
        self._loader_state.epoch += 1
        self._cursor.start_epoch(self)
        if self._seeder is not None:
            self._seeder.base_seed = self._base_seed
            self._seeder.epoch = self._loader_state.epoch

    def _reset(self, loader, first_iter=False):
        super()._reset(loader, first_iter)
        self._begin_epoch()

    def __next__(self):
        if self._cursor.superseded():  # load_state_dict after this iterator began
            self._reset(self._cursor.loader)
        while self._cursor.discarding():  # IterableDataset: batches received before the resume
            super().__next__()
        return super().__next__()

    def _next_data(self):
        while True:
            try:
                data = super()._next_data()
            except Dropped:
                self._cursor.consumed_last()
                continue
            except StopIteration:
                self._cursor.finished()
                raise
            except Exception:
                self._cursor.consumed_last()  # the user got this batch's error
                raise
            self._cursor.consumed_last()
            return data


def _shared_memory_cap(value):
    return _options.shared_memory_cap(value)
