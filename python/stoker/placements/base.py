"""The seam between the iterator and its workers: what every placement provides.

Scheduling (which task goes to which worker, in torch's order), supervision (restart, re-issue
exactly once, quarantine, hang handling), resume and autotune live in ``iterators/`` and talk to
workers only through ``Workers``. A placement decides where and how a worker runs: local
processes over the C++ Supervisor (``local.py``) today; threads in this process, or actors on
other machines, behind the same methods. docs/design/placements.md says what a new one must
guarantee.

Thread contract: every method may be called by the thread that iterates; ``has``, ``pid``,
``status``, ``stats``, ``slot_usage``, ``seconds_in``, ``processes`` and ``shutdown`` may also be
called from any other thread at any time (monitoring, ``__del__``), and an implementation must
make them safe for that.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass


@dataclass
class Hung:
    """Why the iterator kills a worker on purpose (``Workers.kill``): the death that follows is
    named with it."""

    index: object  # the dataset index it was loading (None when it was not loading)
    seconds: float  # how long it was at it
    stack: str  # its Python stack just before, '' when it could not be taken
    stuck: str | None = None  # it never took its queued work: the watch's description


class Workers(abc.ABC):
    """The workers of one iterator, by id ``0 .. num_workers-1``. A worker id may be started
    again after its worker ended (a restart)."""

    num_workers: int
    # How workers start, in words for logs and stats ("fork", "spawn", "forkserver", ...).
    start_method: str
    # How long a worker may take to start before it is named as not taking its work.
    start_grace_s: float = 5.0

    # -- life ------------------------------------------------------------------------------------
    @abc.abstractmethod
    def start(self, worker_id: int, config) -> None:
        """Starts worker `worker_id` with `config` (``engine.worker.WorkerConfig``). Raises
        what starting raised (a pickling error under spawn, say); the iterator explains it."""

    def start_all(self, count: int, config) -> None:
        """Starts workers ``0 .. count-1``."""
        for w in range(count):
            self.start(w, config)

    @abc.abstractmethod
    def stop(self, worker_id: int) -> None:
        """Ends the worker on purpose (its stream ended): no event reports its end."""

    @abc.abstractmethod
    def kill(self, worker_id: int, hung: Hung) -> None:
        """Ends the worker at once because it hung; ``wait`` then reports a ``WorkerExited``
        named with `hung`."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Ends every worker and frees everything they hold (idempotent, any thread)."""

    # -- messages --------------------------------------------------------------------------------
    @abc.abstractmethod
    def send_task(self, worker_id: int, task: int, index) -> bool:
        """Sends task number `task` (the sampler's `index`: a list of indices or one index).
        False when the worker is gone; its end is reported by ``wait``."""

    @abc.abstractmethod
    def set_memory_share(self, worker_id: int, nbytes: int | None) -> bool:
        """The most the worker's batches may take from now on (None: no cap); a worker over
        a lowered share lets go of free buffers at once. False when it is gone."""

    @abc.abstractmethod
    def begin_epoch(self, worker_id: int, epoch: int, payload: bytes) -> bool:
        """Tells a persistent worker that epoch `epoch` begins (`payload`:
        ``protocol.encode_resume``); it answers with ``EpochBegun``. False when it is gone."""

    @abc.abstractmethod
    def wait(self, timeout_s: float | None):
        """The next event (``engine.events``): an outcome, a stream's state, skips, an
        ``EpochBegun``, or a ``WorkerExited`` for a worker that ended unexpectedly; None after
        `timeout_s` seconds. Events of one worker come in the order it sent them, and all of
        them before its ``WorkerExited``. Returns promptly on a signal (Ctrl+C)."""

    # -- reading ---------------------------------------------------------------------------------
    @abc.abstractmethod
    def has(self, worker_id: int) -> bool:
        """The worker is running (started, and its end not yet reported or asked for)."""

    @abc.abstractmethod
    def pid(self, worker_id: int) -> int | None:
        """The worker's process id where it has one this machine can see, else None."""

    @abc.abstractmethod
    def status(self, worker_id: int) -> dict | None:
        """The worker's own report, None before it made one: ``state`` ("starting", "idle",
        "loading", "collating", "encoding"), ``state_seconds``, ``index`` and ``position`` of
        the sample being loaded, ``task``, ``samples``, ``batches``, ``rss_bytes``,
        ``bytes_sent``, ``seconds_in`` (per state)."""

    @abc.abstractmethod
    def is_stopped(self, worker_id: int) -> bool:
        """The worker cannot run at all (SIGSTOP, a debugger, a frozen cgroup)."""

    @abc.abstractmethod
    def started_at(self, worker_id: int) -> float:
        """``time.monotonic()`` when the worker was last started."""

    @abc.abstractmethod
    def last_sent(self, worker_id: int) -> float:
        """``time.monotonic()`` just before the last message went to the worker (0: none)."""

    @abc.abstractmethod
    def capture_stack(self, worker_id: int) -> str:
        """The worker's Python stack now ('' when it cannot answer)."""

    @abc.abstractmethod
    def cpu_seconds(self, worker_id: int) -> float:
        """CPU seconds the worker used since it started (0 when unknown)."""

    @abc.abstractmethod
    def slot_usage(self) -> dict:
        """The batches' memory: ``slots``, ``bytes_mapped``, ``slots_held_by_user``,
        ``bytes_held_by_user``, ``slots_waiting``, ``bytes_waiting``."""

    @abc.abstractmethod
    def stats(self) -> list[dict]:
        """Per worker: ``id``, ``pid``, ``alive`` and, while it runs, its status."""

    def config_changed(self, config) -> None:
        """The config a worker started now would get (a new epoch, a new memory share): for a
        placement that starts workers again by itself (Ray, once the cluster has room); others
        are given the config with each start and ignore this."""
        return None

    def scale_hint(self) -> str:
        """What would give the workers more room, for the data-stall notice."""
        import os

        return (f"More num_workers (this process may use {len(os.sched_getaffinity(0))} CPUs), "
                "cheaper samples or a larger prefetch_factor would help (num_workers=\"auto\" "
                "and prefetch_factor=\"auto\" tune both), or workers on more machines "
                "(placement=stoker.Ray(...)).")

    def seconds_in(self) -> dict:
        """Seconds all running workers spent in each state."""
        totals: dict = {}
        for w in range(self.num_workers):
            st = self.status(w)
            for k, v in (st or {}).get("seconds_in", {}).items():
                totals[k] = totals.get(k, 0.0) + v
        return totals

    @property
    def processes(self) -> list:
        """The latest process of each worker (what torch's iterator keeps in ``_workers``):
        objects with ``pid``, ``is_alive()`` and ``join()`` where the placement has them."""
        return []
