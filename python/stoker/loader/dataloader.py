"""stoker.DataLoader: torch's DataLoader with stoker's engine underneath.

It *is* a ``torch.utils.data.DataLoader`` (a subclass), so argument checking, samplers, ``len()``,
``persistent_workers`` and every ``isinstance`` check in user code behave exactly as torch's.
``num_workers=0`` loads in the main process as torch does. With workers, batches come from
stoker's supervised multi-process iterator. stoker's options are public attributes named like the
keywords (frameworks re-create loaders from attributes); each iterator gets them resolved as one
``Options``. What the loader remembers (epochs, skips, deaths, the resume point) is its one
side-car, ``config.records``.

Thread contract: as torch's DataLoader; ``stats()``, ``skipped`` and ``deaths`` may be read from
any thread.
"""

from __future__ import annotations

from typing import TypeVar

import torch.utils.data

from ..common import system as _system
from ..config.options import Options
from ..config.records import SkippedSample, records_of
from .autotune.tuner import START_DEPTH
from .iterators import serve
from .iterators.stats import loader_stats
from .resume import checkpoint

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
        threads_per_worker=None,
        hang_timeout=None,
        stall_notice=0.5,
        max_shared_memory="auto",
        seed=None,
        autotune=False,
        autotune_prefetch=False,
        placement=None,
        ray_address=None,
        device=None,
    ):
        # num_workers="auto": torch checks for an int, so the bound (the CPUs this process may
        # take: all it may use, or its share when several ranks of a job share this machine)
        # goes to torch and the iterator tunes how many of those workers take tasks (loader/autotune/).
        if isinstance(num_workers, str) and num_workers == "auto":
            num_workers, autotune = _system.rank_cpus(), True
        # prefetch_factor="auto": torch gets where the depth starts (its own default), and the
        # iterator tunes it. With num_workers=0 there is nothing to tune (torch wants None).
        if isinstance(prefetch_factor, str) and prefetch_factor == "auto":
            prefetch_factor = START_DEPTH if num_workers else None
            autotune_prefetch = True
        options = Options(
            on_worker_death=on_worker_death, max_restarts=max_restarts, on_error=on_error,
            max_retries=max_retries, quarantine_after=quarantine_after,
            threads_per_worker=threads_per_worker, hang_timeout=hang_timeout, stall_notice=stall_notice,
            max_shared_memory=max_shared_memory, seed=seed, autotune=autotune,
            autotune_prefetch=autotune_prefetch, placement=placement, ray_address=ray_address,
            device=device)
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
        for name, value in options.as_dict().items():
            setattr(self, name, value)
        records_of(self)

    @property
    def options(self) -> Options:
        """The stoker options an iterator of this loader runs with now."""
        return Options.of(self)

    def __getstate__(self):
        # Pickles and copies at any time: a live iterator (persistent workers) stays with this
        # loader, and the copy gets its own records.
        d = dict(self.__dict__)
        d["_iterator"] = None
        d["_stoker"] = records_of(self).copy()
        return d

    def __setstate__(self, d):
        self.__dict__.update(d)
        # A loader pickled by an older release: the options it did not have take their
        # defaults, and its records take today's form.
        for name, value in Options().as_dict().items():
            self.__dict__.setdefault(name, value)
        records_of(self)

    @property
    def skipped(self) -> list[SkippedSample]:
        """Samples dropped by ``on_error="skip"`` or quarantine: ``.index``, ``.reason``,
        ``.epoch``."""
        return records_of(self).skipped

    @property
    def deaths(self) -> list:
        """Every worker death so far: worker id, pid, signal or exit code, cause, index."""
        return records_of(self).deaths

    def stats(self) -> dict:
        """What the loader is doing, as a JSON-serialisable dict: per worker (id, pid, state,
        index being loaded, samples, batches, restarts, seconds in __getitem__ / collate /
        encode / idle, RSS) and for the loader (batches yielded, seconds the loop waited for
        data and that share of its time, the data stall; slots and bytes mapped, held by the
        user and waiting; deaths with their causes; skipped and quarantined samples; which loader
        class and who served it: ``served_by`` is "stoker.DataLoader" or "stoker.enable()")."""
        return loader_stats(self)

    def __iter__(self):
        serve.forget_closed_iterator(self)
        return super().__iter__()

    def __len__(self) -> int:
        # torch's count, except while an epoch resumed under another batch size or world size
        # is loaded or under way: the batches it had delivered plus those of its rest.
        n = checkpoint.epoch_length(self, records_of(self))
        return super().__len__() if n is None else n

    # -- checkpoint and resume (loader/resume/) ----------------------------------------------------------
    def state_dict(self) -> dict:
        """Where this loader is: the epoch, the batches of it the user has received, what
        regenerates its order, the skipped samples. Callable at any time; a plain dict with a
        ``version`` (``torch.save`` and ``torch.distributed.checkpoint`` take it)."""
        return checkpoint.get_state(self, records_of(self), self.options)

    def load_state_dict(self, state_dict: dict) -> None:
        """Makes the next iteration continue with the first batch the saved loader had not
        yielded (under any ``num_workers``); raises ``StateMismatchError`` naming what differs
        when the state comes from a loader that orders samples differently. With a
        ``DistributedSampler``, a list of the states of all ranks of the saved job resumes on
        another number of ranks: the rest of the epoch is split among them (loader/resume/elastic.py)."""
        checkpoint.set_state(self, records_of(self), state_dict)

    @staticmethod
    def delivered_all(state_dict) -> bool | None:
        """Whether the epoch a state was saved in had delivered every batch: True when it was
        saved after the loop ended (``state_dict["finished"]``: a resume begins the next epoch)
        or inside the loop after the epoch's last batch (a resume finishes that epoch, yielding
        nothing, with a warning); False when batches were left; None when the loader could not
        tell (an IterableDataset mid-epoch). Reads states of earlier releases too."""
        return checkpoint.delivered_all(state_dict)

    def _get_iterator(self):
        return serve.new_iterator(self, self.options, "stoker.DataLoader")
