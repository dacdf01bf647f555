"""Local processes: the default placement. Workers are processes of this machine, started with
the multiprocessing context the user picked, each with a SOCK_SEQPACKET channel, a pidfd and
memfd slots, all watched by one C++ ``Supervisor`` (the only code that touches it).

It turns the Supervisor's messages into ``wire.events`` and names every unexpected death
(signal, exit code, OOM kill read from the memory cgroup, the crash log's Python stack, the last
lines of stderr, or the hang the iterator killed it for).

Each worker id has one record (``_Process``: its process, when it started, when a message last
went to it, whether it was told to leave or killed for a hang), kept from its start until its end
is seen; ``view`` reads it with the Supervisor's status page and one read of ``/proc``.

Thread contract (``base.Workers``): ``start``, ``stop``, ``kill``, ``send_task``,
``begin_epoch`` and ``wait`` are called by the thread that iterates (one at a time: the iterator
is not re-entrant, like torch's). ``view``, ``capture_stack``, ``stats``, ``slot_usage``,
``seconds_in``, ``processes`` and ``shutdown`` may be called from any thread at any time (a
monitoring thread, ``stoker top``'s exporter, ``__del__`` run by the garbage collector of another
thread): the records are guarded by one lock, and the Supervisor itself is safe for concurrent
use.
Workers are not tied to the thread that started them: they die with the main *process*.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import time
import warnings
from dataclasses import dataclass

from .. import _stoker
from ..common import deaths
from ..common import system as _system
from ..common.errors import EngineError
from ..pickling import by_value as _by_value
from ..wire import fdpass, protocol
from ..wire.events import WorkerExited, from_message
from ..wire.sealed import PerWorker, Sealed
from ..worker.process import DUMP_SIGNAL, parent_pid_for, worker_main
from .base import Hung, Workers, WorkerView

log = logging.getLogger("stoker")

# How long to wait for a dead or stopped worker to be reaped.
EXIT_GRACE_S = 1.0
BUSY = ("loading", "collating", "encoding")

# Threads that hold no lock a forked child could need: multiprocessing's queue feeders (left by
# torch's own DataLoader, for one) reset their state after a fork; tqdm's monitor sleeps between
# brief checks of its bars (every progress-bar user has one: a warning there would be noise);
# the node placement's release senders wait on their own pipe and write only their own socket.
_FORK_SAFE_THREADS = ("QueueFeederThread", "tqdm_monitor", "stoker-node-release")


@dataclass
class _Process:
    """One worker id's process, from its start until its end is seen."""

    proc: object  # the multiprocessing.Process
    started_at: float  # time.monotonic() at its start
    last_sent: float = 0.0  # time.monotonic() just before a message last went to it
    leaving: bool = False  # told to exit (stop): its end is no error and is not reported
    hung: Hung | None = None  # killed on purpose, for a hang: its death is named with it


def other_threads() -> list[str]:
    """The names of this process's other live Python threads, but those known to hold no lock a
    forked child could need."""
    me = threading.current_thread()
    return [t.name for t in threading.enumerate()
            if t is not me and t.is_alive() and t.name not in _FORK_SAFE_THREADS]


class LocalProcesses(Workers):
    def __init__(self, ctx, num_workers: int, loader_token: int, sealed: Sealed | None = None,
                 keep_slot_fds: bool = False):
        """`ctx`: the multiprocessing context; `loader_token` names the workers' status pages
        after the loader's board (``stoker top`` pairs them). `sealed` (spawn, forkserver):
        what every worker starts from, made by the caller, who closes it (the node pool has
        it from a rank); `keep_slot_fds`: each slot's memfd stays open (``PendingBatch.fd``)
        so a batch can be passed on to another process."""
        self._ctx = ctx
        self.start_method = ctx.get_start_method()
        self.num_workers = num_workers
        self._token = loader_token
        self._lock = threading.RLock()
        self._sup = _stoker.Supervisor()
        if keep_slot_fds:
            self._sup.keep_slot_fds()
        fdpass.register_supervisor(self._sup)
        self._given = sealed
        self._workers: dict[int, _Process] = {}  # worker id -> its process, until its end
        # The latest process of each worker id, live or ended, as torch's iterator keeps them
        # (a restart replaces it, so a long job with restarts holds no growing list).
        self._last_procs: list = [None] * num_workers
        self._oom_before = _system.oom_kills()
        self._closed = False
        # spawn/forkserver: (dataset, collate_fn, worker_init_fn) and the one memfd every worker
        # started from them maps (wire/sealed.py): pickled once, not once per worker.
        self._sealed: tuple[tuple, Sealed | None] | None = None

    # -- life ------------------------------------------------------------------------------------
    def start_all(self, count: int, config) -> None:
        if self.start_method == "fork":
            self._warn_other_threads()
        super().start_all(count, config)

    def _warn_other_threads(self) -> None:
        names = other_threads()
        if names:
            warnings.warn(
                f"stoker: forking DataLoader workers while this process runs other threads "
                f"({', '.join(names[:8])}{'...' if len(names) > 8 else ''}). A lock one of them "
                "holds at the fork stays locked forever in the workers, which can hang them at "
                "start-up or on their first sample (stoker names such a worker). If workers "
                "hang, pass multiprocessing_context='forkserver' (or 'spawn').",
                RuntimeWarning, stacklevel=6,
            )

    def _sealed_for(self, config) -> Sealed | None:
        """The memfd of `config`'s dataset, collate_fn and worker_init_fn, made at the first
        start that needs it and kept for restarts; made again only when one of them is another
        object (never for a new epoch of the same loader). None: they hold something that must
        be pickled for each worker (``sealed.PerWorker``); then each start pickles them, as plain
        spawn does."""
        if self._given is not None:
            return self._given
        key = (config.dataset, config.collate_fn, config.init_fn)
        with self._lock:
            if self._sealed is not None and all(a is b for a, b in zip(self._sealed[0], key)):
                return self._sealed[1]
        try:
            sealed = Sealed(key)  # outside the lock: pickling a large dataset takes a while
        except PerWorker as e:
            log.debug("stoker: the dataset is pickled for each worker: it holds %s", e)
            sealed = None
        with self._lock:
            old, self._sealed = self._sealed, (key, sealed)
            if old is not None and old[1] is not None:
                old[1].close()
            if self._closed and sealed is not None:  # shut down meanwhile (start then refuses)
                sealed.close()
        return sealed

    def start(self, worker_id: int, config) -> None:
        sealed = carried = None
        if self.start_method != "fork":
            sealed = self._sealed_for(config)
            # what the worker starts from: the sealed memfd, or a pickle of its own (what pickle
            # refuses goes by value in both: stoker.pickling.by_value)
            carried = sealed if sealed is not None else _by_value.Carried(
                (config.dataset, config.collate_fn, config.init_fn))
            config = dataclasses.replace(config, dataset=None, collate_fn=None, init_fn=None)
        main_end, child_end = _stoker.channel_pair()
        fdpass.track(main_end, child_end)
        try:
            proc = self._ctx.Process(
                target=worker_main,
                args=(fdpass.ChannelFd(child_end), worker_id, config,
                      # The worker checks that its parent is still there; under forkserver its
                      # parent is the fork server, not this process (the channel covers us).
                      parent_pid_for(self.start_method), self._token, carried),
                daemon=True,
            )
            if sealed is None:
                proc.start()
            else:  # under the lock: shutdown (any thread) never closes the memfd mid-start
                with self._lock:
                    if self._closed:
                        raise EngineError("stoker: the workers were shut down while one started")
                    proc.start()
        except BaseException:
            fdpass.untrack(main_end, child_end)
            os.close(main_end)
            os.close(child_end)
            raise
        fdpass.untrack(main_end, child_end)
        os.close(child_end)
        with self._lock:
            self._sup.add_worker(worker_id, main_end, proc.pid)
            # (an earlier process of this id that was told to leave is reaped by shutdown's
            # join or by multiprocessing, which reaps finished children at each start)
            self._workers[worker_id] = _Process(proc, time.monotonic())
            self._last_procs[worker_id] = proc

    def stop(self, worker_id: int) -> None:
        """Closes the worker's channel: its watchdog ends it at once; its exit is expected."""
        with self._lock:
            rec = self._workers.get(worker_id)
            if rec is not None:
                rec.leaving = True
            self._sup.remove_worker(worker_id)

    def kill(self, worker_id: int, hung: Hung) -> None:
        with self._lock:
            rec = self._workers.get(worker_id)
            if rec is not None:
                rec.hung = hung
        try:
            self._sup.signal(worker_id, signal.SIGKILL)
        except EngineError:
            pass

    def shutdown(self) -> None:
        """Ends every worker and reaps it (idempotent, any thread)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            procs = [rec.proc for rec in self._workers.values()]
            for w in range(self.num_workers):
                self._sup.remove_worker(w)  # closing the channel ends the worker
            self._workers.clear()
            if self._sealed is not None and self._sealed[1] is not None:
                self._sealed[1].close()
            self._sealed = None
        deadline = time.monotonic() + EXIT_GRACE_S
        for proc in procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join()

    # -- messages --------------------------------------------------------------------------------
    def _send(self, worker_id: int, mtype: int, task: int, a: int = 0, payload: bytes = b"",
              b: int = 0) -> bool:
        # Stamped before sending: a worker that takes the message enters its next state after it.
        sent_at = time.monotonic()
        try:
            self._sup.send(worker_id, mtype, task, a, payload, b)
        except EngineError:
            return False
        rec = self._workers.get(worker_id)  # (only this thread adds or removes records)
        if rec is not None:
            rec.last_sent = sent_at
        return True

    def send_task(self, worker_id: int, task: int, index, serial: bool = False) -> bool:
        return self.send_encoded_task(worker_id, task, *protocol.encode_index(index), serial)

    def send_encoded_task(self, worker_id: int, task: int, fmt: int, payload: bytes,
                          serial: bool = False) -> bool:
        """``send_task`` of an index already encoded (``protocol.encode_index``): the node pool
        passes a rank's on without reading it (it may name classes only the rank has)."""
        return self._send(worker_id, protocol.MSG_TASK, task, fmt, payload, int(serial))

    def set_memory_share(self, worker_id: int, nbytes: int | None) -> bool:
        return self._send(worker_id, protocol.MSG_LIMIT, 0, nbytes or 0)

    def begin_epoch(self, worker_id: int, epoch: int, payload: bytes) -> bool:
        return self._send(worker_id, protocol.MSG_RESUME, epoch, 0, payload)

    def wait(self, timeout_s):
        while True:
            ev = self._sup.wait(timeout_s)
            if ev is None:
                return None
            if ev[0] == "died":
                out = self._on_exit(ev)
                if out is None:  # a worker we stopped: nothing to report
                    timeout_s = 0.0 if timeout_s is not None else None
                    continue
                return out
            out = _event(ev)
            if out is not None:
                return out

    def _on_exit(self, ev):
        _, worker_id, exit_code, signum, core = ev
        with self._lock:
            rec = self._workers.pop(worker_id, None)
            leaving = rec is None or rec.leaving
            status = None if leaving else (self._sup.status(worker_id) or {})
            crash_log = "" if leaving else self._sup.read_log(worker_id, protocol.LOG_CRASH, 1 << 16)
            stderr_tail = "" if leaving else self._sup.read_log(worker_id, protocol.LOG_STDERR, 8192)
            self._sup.remove_worker(worker_id)
        proc = rec.proc if rec is not None else None
        if proc is not None:
            proc.join(timeout=EXIT_GRACE_S)
            # multiprocessing may have reaped it first (Process.start() reaps finished children),
            # in which case only it knows the status.
            if proc.exitcode is not None:
                signum, exit_code = (-proc.exitcode, None) if proc.exitcode < 0 else (0, proc.exitcode)
        if leaving:
            return None
        pid = proc.pid
        hung = rec.hung
        busy = status.get("state") in BUSY
        index = hung.index if hung else (status.get("index") if busy else None)
        oom_now = _system.oom_kills()
        oom = signum == signal.SIGKILL and hung is None and any(
            b is not None and a is not None and a > b for a, b in zip(oom_now, self._oom_before)
        )
        self._oom_before = oom_now
        cause, explanation = deaths.describe(
            signum, exit_code, core, oom=oom, rss=status.get("rss_bytes"), index=index,
            crash_log=crash_log, stderr_tail=stderr_tail,
            hung=(hung.seconds, hung.stack) if hung else None,
            stuck=hung.stuck if hung else None,
        )
        return WorkerExited(worker=worker_id, pid=pid, signum=signum,
                            exit_code=None if signum else exit_code, cause=cause,
                            explanation=explanation, index=index, busy=busy,
                            hung=hung is not None, started=bool(status) or hung is not None,
                            outside=signum == signal.SIGKILL and not oom and hung is None,
                            task=status.get("task") if busy or hung else None,
                            position=status.get("position") if busy or hung else None,
                            start_failed=not status and hung is None and not signum)

    # -- reading ---------------------------------------------------------------------------------
    @property
    def processes(self) -> list:
        """The latest process of each worker (multiprocessing.Process: ``.pid``, ``.is_alive()``,
        ``.join()``), by worker id, as torch's iterator keeps them in ``_workers``: ended ones
        stay listed until a restart replaces them. A copy, so a reader in another thread never
        sees it change."""
        with self._lock:
            return [p for p in self._last_procs if p is not None]

    def view(self, worker_id: int) -> WorkerView | None:
        with self._lock:
            rec = self._workers.get(worker_id)
            if rec is None or rec.leaving or not self._sup.has_worker(worker_id):
                return None
            status = self._sup.status(worker_id)
            pid, started_at, last_sent = rec.proc.pid, rec.started_at, rec.last_sent
        stopped, cpu = _system.stopped_and_cpu(pid)
        return WorkerView(pid, started_at, last_sent, _since_ready(cpu, status, "cpu"), stopped,
                          status)

    def schedstat_of(self, worker_id: int) -> tuple[float, float] | None:
        v = self.view(worker_id)
        if v is None or not v.pid:
            return None
        both = _system.schedstat_seconds(v.pid)
        if both is None:
            return None
        return (_since_ready(both[0], v.status, "cpu"),
                _since_ready(both[1], v.status, "runqueue"))

    def capture_stack(self, worker_id: int, wait_s: float = 1.0) -> str:
        """Asks the worker for its Python stack (faulthandler on DUMP_SIGNAL) and returns it
        ('' when it cannot answer: not started yet, stopped, or gone)."""
        v = self.view(worker_id)
        if v is None or v.stopped or v.status is None or v.status["state"] == "starting":
            # Not yet past the point where it installs its faulthandler (it shares its crash log
            # before its status page), or still starting: DUMP_SIGNAL's default would kill it.
            return ""
        before = self._sup.read_log(worker_id, protocol.LOG_CRASH, 1 << 20)
        try:
            self._sup.signal(worker_id, DUMP_SIGNAL)
        except EngineError:
            return ""
        end = time.monotonic() + wait_s
        text = before
        while time.monotonic() < end:
            time.sleep(0.02)
            text = self._sup.read_log(worker_id, protocol.LOG_CRASH, 1 << 20)
            if len(text) > len(before) and text.endswith("\n"):
                time.sleep(0.02)
                text = self._sup.read_log(worker_id, protocol.LOG_CRASH, 1 << 20)
                break
        new = text[len(before):] if text.startswith(before) else text
        return deaths.trim_stack(new.strip())

    def slot_usage(self) -> dict:
        return self._sup.slot_usage()

    def mapped_slots(self) -> int:
        """Slots mapped in this process (tests: slots are reused, not made per batch)."""
        return self._sup.mapped_slot_count

    def owned_fds(self) -> list[int]:
        """The descriptors the Supervisor holds (tests: a child closes them)."""
        return list(self._sup.owned_fds())


def _event(ev):
    """The Supervisor's ("message", worker, type, task, a, b, c, payload, pending) as an event;
    None for what is no event (a log descriptor the Supervisor kept)."""
    _, worker, mtype, task, a, _b, _c, payload, pending = ev
    return from_message(worker, mtype, task, a, payload, pending)


def _since_ready(seconds: float, status, kind: str) -> float:
    """`seconds` of a worker's CPU (`kind` "cpu") or run-queue time ("runqueue"), from the
    kernel, less what it had spent when it was ready to serve (its status page): its start-up
    (imports, the dataset's unpickling, worker_init_fn) is not work. 0 before it is ready, so
    that a window that begins then and ends after counts only its work."""
    ready = status.get(f"ready_{kind}_seconds") if isinstance(status, dict) else None
    return 0.0 if ready is None else max(0.0, seconds - ready)
