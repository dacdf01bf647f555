"""The seam between the iterator and its workers: what every placement provides.

Scheduling (which task goes to which worker, in torch's order), supervision (restart, re-issue
exactly once, quarantine, hang handling), resume and autotune live in ``loader/iterators/`` and talk to
workers only through ``Workers``. A placement decides where and how a worker runs: processes of
this machine (``local.py``), actors on a Ray cluster (``ray/``), or some of each (``mixed.py``).
docs/design/placements.md says what a new one must provide and guarantee.

A placement implements eleven methods: five that change a worker's life (``start``, ``stop``,
``kill``, ``shutdown``) or send it a message (``send_task``, ``set_memory_share``,
``begin_epoch``), one wait for events, and three reads (``view``: one record per worker,
``capture_stack``, ``slot_usage``). Everything the iterator reports (``stats``, ``seconds_in``)
is built here from those reads, once for every placement. Two more have defaults a placement
may refine: ``schedstat_of`` (the seconds a worker was on a CPU and waited for one, from which
``runqueue_of``) and ``cpus_per_worker`` (the CPUs one worker may keep busy, carried in
``LoadSettings.cpus``).

Thread contract: every method may be called by the thread that iterates; ``view``,
``capture_stack``, ``slot_usage``, ``stats``, ``seconds_in``, ``schedstat_of``, ``runqueue_of``,
``runqueue_seconds``, ``where``, ``processes`` and ``shutdown`` may also be called from any other thread at any time (monitoring, ``__del__``), and
an implementation must make them safe for that.
"""

from __future__ import annotations

import abc
import os
from dataclasses import dataclass

from ..common import system as _system

# hang_timeout bounds one sample, not a start-up: a worker that is still starting (importing
# torch under spawn on a busy machine, a slow worker_init_fn) is only killed as stuck after this
# long (unless the kernel says it is stopped). The iterator's hang watch and the node pool both
# hold to it.
STARTUP_GRACE_S = 60.0


@dataclass
class Hung:
    """Why the iterator kills a worker on purpose (``Workers.kill``): the death that follows is
    named with it."""

    index: object  # the dataset index it was loading (None when it was not loading)
    seconds: float  # how long it was at it
    stack: str  # its Python stack just before, '' when it could not be taken
    stuck: str | None = None  # it never took its queued work: the watch's description


@dataclass(frozen=True)
class WorkerView:
    """One running worker as its placement sees it now (``Workers.view``): a snapshot of plain
    values, safe to keep and to read from any thread."""

    pid: int | None  # its process, where it has one (an actor's pid on its node)
    started_at: float  # ``time.monotonic()`` when it was last started
    last_sent: float  # ``time.monotonic()`` just before the last message went to it (0: none)
    # CPU seconds it used since it was ready to serve (0 when unknown): its start-up (imports,
    # the dataset's unpickling, worker_init_fn; ~2 s of torch's import under spawn and
    # forkserver) is not work, and counted in it would read as computing
    cpu_seconds: float
    stopped: bool  # it cannot run at all (SIGSTOP, a debugger, a frozen cgroup)
    # Its own report, None before it made one: ``state`` ("starting", "idle", "loading",
    # "collating", "encoding"), ``state_seconds``, ``index`` and ``position`` of the sample being
    # loaded, ``task``, ``samples``, ``batches``, ``rss_bytes``, ``bytes_sent``, ``seconds_in``
    # (seconds per state).
    status: dict | None
    # Seconds its threads waited for a CPU (runnable, on the kernel's run queue) since it was
    # ready, where the view has it at no cost (a Ray actor's own report); None otherwise:
    # ``Workers.runqueue_of`` reads it for a local worker when asked.
    runqueue_seconds: float | None = None


# What ``stats()`` reports of a worker's status, and the names it gives the seconds per state.
_STATUS_FIELDS = ("state", "index", "task", "samples", "batches", "rss_bytes", "bytes_sent",
                  "in_flight", "ready_cpu_seconds", "ready_runqueue_seconds")
_SECONDS = {"getitem": "loading", "collate": "collating", "encode": "encoding", "idle": "idle"}


class Workers(abc.ABC):
    """The workers of one iterator, by id ``0 .. num_workers-1``. A worker id may be started
    again after its worker ended (a restart)."""

    num_workers: int
    # How workers start, in words for logs and stats ("fork", "spawn", "forkserver", "ray"...).
    start_method: str
    # How long a worker may take to start before it is named as not taking its work.
    start_grace_s: float = 5.0

    # -- life ------------------------------------------------------------------------------------
    @abc.abstractmethod
    def start(self, worker_id: int, config) -> None:
        """Starts worker `worker_id` with `config` (``worker.loop.WorkerConfig``). Raises
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
    def send_task(self, worker_id: int, task: int, index, serial: bool = False) -> bool:
        """Sends task number `task` (the sampler's `index`: a list of indices or one index);
        `serial`: its samples load one by one whatever threads_per_worker says (a task
        re-issued after a death with several of its samples in flight). False when the worker
        is gone; its end is reported by ``wait``."""

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
        """The next event (``wire.events``): an outcome, a stream's state, skips, an
        ``EpochBegun``, a ``WorkerExited`` for a worker that ended unexpectedly, or (a placement
        whose workers may find no room) ``WorkerLost`` / ``WorkerReady``; None after
        `timeout_s` seconds. Events of one worker come in the order it sent them, and all of
        them before its ``WorkerExited``. Returns promptly on a signal (Ctrl+C)."""

    # -- reading ---------------------------------------------------------------------------------
    @abc.abstractmethod
    def view(self, worker_id: int) -> WorkerView | None:
        """The worker now, or None when it is not running (never started, its end reported or
        asked for)."""

    @abc.abstractmethod
    def capture_stack(self, worker_id: int) -> str:
        """The worker's Python stack now ('' when it cannot answer)."""

    @abc.abstractmethod
    def slot_usage(self) -> dict:
        """The batches' memory: ``slots``, ``bytes_mapped``, ``slots_held_by_user``,
        ``bytes_held_by_user``, ``slots_waiting``, ``bytes_waiting``."""

    # -- optional --------------------------------------------------------------------------------
    @property
    def ids(self):
        """The worker ids this placement runs (``stats()`` lists them)."""
        return range(self.num_workers)

    def where(self, worker_id: int) -> dict:
        """What ``stats()`` says of where the worker runs, beyond its pid (Ray: the node)."""
        return {}

    def serving(self) -> dict | None:
        """What serves these workers beyond themselves, for ``stats()`` (the node's pool: its
        pid, its workers and their pids, the ranks it serves); None for most placements."""
        return None

    def config_changed(self, config) -> None:
        """The config a worker started now would get (a new epoch, a new memory share): for a
        placement that starts workers again by itself (Ray, once the cluster has room); others
        are given the config with each start and ignore this."""
        return None

    def cpus_per_worker(self) -> int:
        """The CPUs one worker may keep busy: those this process may take (its affinity and
        cgroup quota, its rank's share of the machine: ``system.rank_cpus``) divided among the
        loader's workers; at least 1. "auto" widens a worker that computes on a free-threaded
        interpreter up to this many threads."""
        return max(1, _system.rank_cpus() // max(1, self.num_workers))

    def scale_hint(self) -> str:
        """What would give the workers more room, for the data-stall notice."""
        return (f"More num_workers (this process may use {len(os.sched_getaffinity(0))} CPUs), "
                "cheaper samples or a larger prefetch_factor would help (num_workers=\"auto\" "
                "and prefetch_factor=\"auto\" tune both), or workers on more machines "
                "(placement=stoker.Ray(...)).")

    @property
    def processes(self) -> list:
        """The latest process of each worker (what torch's iterator keeps in ``_workers``):
        objects with ``pid``, ``is_alive()`` and ``join()`` where the placement has them."""
        return []

    # -- built once, from the reads --------------------------------------------------------------
    def stats(self) -> list[dict]:
        """Per worker: ``id``, ``pid``, ``alive``, where it runs and, while it runs, its status
        (state, index, task, counters, seconds per stage)."""
        out = []
        for w in self.ids:
            v = self.view(w)
            st = v.status if v is not None else None
            entry = {"id": w, "pid": v.pid if v is not None else None, "alive": bool(st)}
            entry.update(self.where(w))
            if st:
                entry.update({k: st.get(k) for k in _STATUS_FIELDS})
                seconds = st.get("seconds_in") or {}
                entry["seconds"] = {k: seconds.get(s, 0.0) for k, s in _SECONDS.items()}
            out.append(entry)
        return out

    def cpu_seconds(self) -> float | None:
        """CPU seconds the running workers used since they were ready (``WorkerView``); None
        when no placement view knows (a remote worker's)."""
        views = [self.view(w) for w in self.ids]
        known = [v.cpu_seconds for v in views if v is not None and v.cpu_seconds > 0]
        return sum(known) if known else None

    def schedstat_of(self, worker_id: int) -> tuple[float, float] | None:
        """(seconds on a CPU, seconds waiting for one: on the kernel's run queue, runnable, every
        CPU it may use taken) of worker `worker_id`'s threads since it was ready (its start-up
        not counted); None where the placement cannot read the run queue. Read when asked (a read per thread), not with
        every ``view``. By default the view's (a Ray actor's own report); a local worker's from
        ``/proc/PID/task/*/schedstat``, to the nanosecond (the view's CPU counts 10 ms ticks)."""
        v = self.view(worker_id)
        if v is None or v.runqueue_seconds is None:
            return None
        return v.cpu_seconds, v.runqueue_seconds

    def runqueue_of(self, worker_id: int) -> float | None:
        """Seconds worker `worker_id`'s threads waited for a CPU since it was ready
        (``schedstat_of``); None where the placement cannot read it. A worker that waits for a CPU computes: the
        tuner, the data-stall notice and ``stoker doctor`` count this time with its CPU
        seconds."""
        both = self.schedstat_of(worker_id)
        return both[1] if both is not None else None

    def runqueue_seconds(self) -> float | None:
        """The running workers' ``runqueue_of`` added up; None when none is known."""
        known = [r for r in (self.runqueue_of(w) for w in self.ids) if r is not None]
        return sum(known) if known else None

    def seconds_in(self) -> dict:
        """Seconds all running workers spent in each state."""
        totals: dict = {}
        for w in self.ids:
            v = self.view(w)
            for k, s in ((v.status or {}).get("seconds_in", {}) if v else {}).items():
                totals[k] = totals.get(k, 0.0) + s
        return totals
