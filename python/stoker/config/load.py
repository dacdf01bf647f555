"""How a worker loads a sample: one frozen record, made once in the training process.

``LoadSettings`` holds what a fetcher reads of the user's options: the error policy
(``on_error``), ``max_retries``, and ``threads`` (``threads_per_worker`` resolved for the
dataset: an int or "auto", never None), and what "auto" may widen a worker that computes to on
a free-threaded interpreter: ``cpus``, the worker's share of the CPUs (the placement's
``Workers.cpus_per_worker``; the node's pool sets its own). ``LoadSettings.of(options, dataset,
cpus)`` is the one place it is made, by the iterator (``loader/iterators/multi.py``,
``single.py``); it travels whole
inside ``worker.loop.WorkerConfig`` to every placement (local processes, the node pool, Ray
actors all pickle that) and the fetcher and ``InFlight`` take it whole (``worker/fetch.py``,
``worker/inflight.py``). A new setting a worker reads is a field here, not a new stop on the
way down. A record pickled before a field existed loads with that field's default (a frozen
dataclass's pickle is its ``__dict__``; the class holds the defaults).

Immutable values: safe to share between threads and processes.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from .options import ERROR_POLICIES, MAX_THREADS_PER_WORKER


def is_async(dataset) -> bool:
    """Whether the dataset's __getitem__ or __getitems__ is an ``async def``."""
    for name in ("__getitem__", "__getitems__"):
        f = getattr(type(dataset), name, None)
        if f is not None and inspect.iscoroutinefunction(f):
            return True
    return False


def threads_for(setting, dataset):
    """What ``threads_per_worker`` means for `dataset`: as given, or when it was left unset
    (None), 1 for a dataset that computes and "auto" for one whose __getitem__ or __getitems__
    is an ``async def`` (it says its work waits: many of its coroutines run at once)."""
    if setting is not None:
        return setting
    return "auto" if is_async(dataset) else 1


@dataclass(frozen=True)
class LoadSettings:
    """How every worker of one iterator loads (docs/design/threads.md, errors)."""

    on_error: str = "raise"  # "raise", "skip" or "retry" (Options.on_error)
    max_retries: int = 3  # further attempts of a failing sample under on_error="retry"
    threads: int | str = 1  # samples loading at once: an int >= 1 or "auto" (resolved)
    # the CPUs one worker may keep busy (its share of what this process may use): the most
    # threads "auto" gives a worker that computes, where threads compute at once (no GIL)
    cpus: int = 1

    def __post_init__(self):
        if self.on_error not in ERROR_POLICIES:
            raise ValueError(f"on_error must be one of {ERROR_POLICIES}, got {self.on_error!r}")
        if not (self.threads == "auto" or (isinstance(self.threads, int)
                                           and not isinstance(self.threads, bool)
                                           and 1 <= self.threads <= MAX_THREADS_PER_WORKER)):
            raise ValueError(f"threads must be resolved (an int in [1, "
                             f"{MAX_THREADS_PER_WORKER}] or 'auto'), got {self.threads!r}")
        if isinstance(self.cpus, bool) or not isinstance(self.cpus, int) or self.cpus < 1:
            raise ValueError(f"cpus must be an int >= 1, got {self.cpus!r}")

    @classmethod
    def of(cls, options, dataset, cpus: int = 1) -> LoadSettings:
        """The settings `options` (a ``config.options.Options``) give `dataset`'s workers, each
        of which may keep `cpus` CPUs busy."""
        return cls(on_error=options.on_error, max_retries=options.max_retries,
                   threads=threads_for(options.threads_per_worker, dataset),
                   cpus=max(1, int(cpus)))

    @property
    def retries(self) -> int:
        """How many times a failing sample is tried again (0 unless on_error="retry")."""
        return self.max_retries if self.on_error == "retry" else 0
