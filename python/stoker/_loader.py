"""stoker.DataLoader: torch's DataLoader with stoker's engine underneath.

It *is* a ``torch.utils.data.DataLoader`` (a subclass), so argument checking, samplers, ``len()``,
``persistent_workers`` and every ``isinstance`` check in user code behave exactly as torch's.
``num_workers=0`` loads in the main process as torch does. With workers, batches come from
stoker's supervised multi-process iterator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

import torch.utils.data

from . import _checkpoint, _seeding
from ._fetch import ITERABLE, MAP, Dropped, Fetcher, SkippedSample
from ._iterator import MultiProcessIter
from ._torch_compat import single_process_iterator

T_co = TypeVar("T_co", covariant=True)

_DEATH_POLICIES = ("restart", "raise")
_ERROR_POLICIES = ("raise", "skip", "retry")


@dataclass
class _LoaderState:
    """What a loader remembers across iterators and epochs."""

    epoch: int = 0
    skipped: list = field(default_factory=list)      # SkippedSample records
    deaths: list = field(default_factory=list)       # _deaths.Death records
    death_counts: dict = field(default_factory=dict)  # dataset index -> deaths while loading it
    quarantined: set = field(default_factory=set)
    iterator: object = None  # weakref to the latest multi-process iterator
    logged: set = field(default_factory=set)  # indices whose skip was logged already

    def record_skip(self, rec: SkippedSample) -> None:
        """Keeps the record; logs each index once, however many epochs skip it."""
        from ._recovery import key, log

        self.skipped.append(rec)
        if key(rec.index) not in self.logged:
            self.logged.add(key(rec.index))
            log.warning("stoker: skipped dataset index %r: %s", rec.index, rec.reason)


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
    ):
        if on_worker_death not in _DEATH_POLICIES:
            raise ValueError(
                f"on_worker_death must be one of {_DEATH_POLICIES}, got {on_worker_death!r}"
            )
        if on_error not in _ERROR_POLICIES:
            raise ValueError(f"on_error must be one of {_ERROR_POLICIES}, got {on_error!r}")
        if max_restarts is not None and (not isinstance(max_restarts, int) or max_restarts < 0):
            raise ValueError(f"max_restarts must be None or an int >= 0, got {max_restarts!r}")
        if not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries must be an int >= 0, got {max_retries!r}")
        if not isinstance(quarantine_after, int) or quarantine_after < 1:
            raise ValueError(f"quarantine_after must be an int >= 1, got {quarantine_after!r}")
        max_shared_memory = _shared_memory_cap(max_shared_memory)
        if hang_timeout is not None and not hang_timeout > 0:
            raise ValueError(f"hang_timeout must be None or > 0 seconds, got {hang_timeout!r}")
        super().__init__(
            dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn,
            pin_memory, drop_last, timeout, worker_init_fn, multiprocessing_context, generator,
            prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device, in_order=in_order,
        )
        self._stoker_options = {
            "on_worker_death": on_worker_death,
            "max_restarts": max_restarts,
            "on_error": on_error,
            "max_retries": max_retries,
            "quarantine_after": quarantine_after,
            "hang_timeout": hang_timeout,
            "stall_notice": stall_notice,
            "max_shared_memory": max_shared_memory,
            "seed": _seeding.check(seed),
        }
        self._stoker_state = _LoaderState()

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
        user and waiting; deaths with their causes; skipped and quarantined samples)."""
        st = self._stoker_state
        it = st.iterator() if st.iterator is not None else None
        live = it.stats() if it is not None and not it._shutdown else {
            "workers": [], "batches_yielded": 0, "seconds_waiting_for_data": 0.0,
            "data_stall": 0.0, "memory": {}}
        live.update({
            "epoch": st.epoch,
            "num_workers": self.num_workers,
            "deaths": [{"worker_id": d.worker_id, "pid": d.pid, "signal": d.signal,
                        "exit_code": d.exit_code, "cause": d.cause, "index": _jsonable(d.index),
                        "epoch": d.epoch} for d in st.deaths],
            "skipped": [{"index": _jsonable(s.index), "reason": s.reason, "epoch": s.epoch}
                        for s in st.skipped],
            "quarantined": sorted((_jsonable(q) for q in st.quarantined), key=repr),
        })
        return live

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
        when the state comes from a loader that orders samples differently."""
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
        opts = loader._stoker_options
        self.fetcher = Fetcher(kind, loader.dataset, loader._auto_collation, loader.drop_last,
                               opts["on_error"], opts["max_retries"], seeder)
        self.collate_fn = loader.collate_fn
        self.state = loader._stoker_state
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
        self._loader_state = loader._stoker_state
        self._cursor = _checkpoint.attach(loader, self, kept)
        self._seeder = _seeding.seeder_for(loader, self._base_seed, 0)
        if loader._stoker_options["on_error"] != "raise" or self._seeder is not None:
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
    """max_shared_memory: bytes (int > 0), None (no cap), or "auto" (half the cgroup's memory
    limit; no cap without one)."""
    if value == "auto":
        from ._cgroup import default_shared_memory_cap

        return default_shared_memory_cap()
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        return value
    raise ValueError(
        f"max_shared_memory must be an int number of bytes > 0, None (no cap) or 'auto', "
        f"got {value!r}"
    )


def _jsonable(x):
    return x if isinstance(x, (int, float, str, bool)) or x is None else repr(x)
