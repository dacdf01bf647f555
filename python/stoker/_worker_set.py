"""The worker set: starts, stops and restarts a loader's worker processes, waits on them, watches
for hangs, and names every death. The only code that touches the C++ ``Supervisor``.

Thread contract: ``wait``, ``check`` and ``start``/``stop`` are called by the thread that iterates
(one at a time: the iterator is not re-entrant, like torch's). ``status``, ``stats``,
``slot_usage``, ``processes`` and ``shutdown`` may be called from any thread at any time (a
monitoring thread, ``stoker top``'s exporter, ``__del__`` run by the garbage collector of another
thread): Python state is guarded by one lock, and the Supervisor itself is safe for concurrent use.
Workers are not tied to the thread that started them: they die with the main *process*.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import warnings
from dataclasses import dataclass

from . import _cgroup, _deaths, _fdpass, _protocol, _stoker, _worker
from ._errors import EngineError

log = logging.getLogger("stoker")

# How long to wait for a dead or stopped worker to be reaped.
EXIT_GRACE_S = 1.0
# How often status pages are checked for hangs and workers that do not take their work.
CHECK_EVERY_S = 0.1
# A worker with work queued that has not started it for this long is named (stall notice,
# stats(), one log line); with hang_timeout it is handled as a hang once that passes.
NOT_TAKING_WORK_S = 5.0
# hang_timeout bounds one sample, not a start-up: a worker that is still starting (importing
# torch under spawn on a busy machine, a slow worker_init_fn) is only killed as stuck after this
# long (unless the kernel says it is stopped).
STARTUP_GRACE_S = 60.0
_BUSY = ("loading", "collating", "encoding")


@dataclass
class Exit:
    """A worker's unexpected exit, named."""

    worker_id: int
    pid: int | None
    signum: int
    exit_code: int | None
    cause: str
    explanation: str
    index: object  # the dataset index it was loading when it died, if known
    busy: bool  # it was loading, collating or encoding
    hung: bool  # we killed it for a hang
    started: bool  # it had reported a status page (it got past start-up)
    outside: bool  # a SIGKILL nothing in the loader or the OOM killer explains
    task: int | None = None  # the task it was working on, and the position of the sample in it:
    position: int | None = None  # they name a sample whose index is not an int


@dataclass
class Stuck:
    """A worker that has work queued but does not take it."""

    worker_id: int
    pid: int | None
    state: str  # what its status page says (idle, starting...) or "not started"
    stopped: bool  # the kernel says it is stopped (SIGSTOP, a debugger, a cgroup freezer)
    seconds: float
    queued: int

    stack: str = ""

    def describe(self) -> str:
        if self.stopped:
            why = "it is stopped (state T in /proc: SIGSTOP, a debugger or a cgroup freezer)"
        elif self.state in ("starting", "not started"):
            why = ("it has not finished starting (a slow worker_init_fn or import, or a "
                   "deadlock on a lock inherited at fork from another thread of the parent, "
                   "e.g. OpenCV's or OpenMP's thread pool)")
        else:
            why = ("it is idle but does not read its tasks (deadlocked? a lock inherited at "
                   "fork from another thread of the parent, e.g. OpenCV's or OpenMP's pool)")
        text = (f"worker {self.worker_id} (pid {self.pid}) has had {self.queued} task(s) "
                f"queued for {self.seconds:.1f} s without starting them: {why}")
        if self.stack:
            text += f"\nIts Python stack now:\n{self.stack}"
        return text


def _proc_state(pid) -> str:
    """The one-letter state of `pid` in /proc (R, S, D, T, t, Z...), '' when unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


# Threads that hold no lock a forked child could need: multiprocessing's queue feeders (left by
# torch's own DataLoader, for one) reset their state after a fork; tqdm's monitor sleeps between
# brief checks of its bars (every progress-bar user has one: a warning there would be noise).
_FORK_SAFE_THREADS = ("QueueFeederThread", "tqdm_monitor")


def _other_threads() -> list[str]:
    me = threading.current_thread()
    return [t.name for t in threading.enumerate()
            if t is not me and t.is_alive() and t.name not in _FORK_SAFE_THREADS]


class WorkerSet:
    def __init__(self, ctx, num_workers: int, worker_args, board):
        """`worker_args` are the arguments of ``_worker.worker_main`` after the channel and the
        worker id; `board` is the loader's shared page (its token names the workers' pages)."""
        self._ctx = ctx
        self._method = ctx.get_start_method()
        self._num_workers = num_workers
        self.worker_args = worker_args  # the iterator refreshes them each epoch (seeds)
        self._board = board
        self._lock = threading.RLock()
        self._sup = _stoker.Supervisor()
        _fdpass.register_supervisor(self._sup)
        self._procs: list = [None] * num_workers  # the live process of each worker id
        # The latest process of each worker id, live or ended, as torch's iterator keeps them
        # (a restart replaces it, so a long job with restarts holds no growing list).
        self._last_procs: list = [None] * num_workers
        self._started_at = [0.0] * num_workers
        self._last_send = [0.0] * num_workers  # when a message last went to each worker
        self._leaving: set[int] = set()  # told to exit: their exit is no error
        self._hung: dict[int, tuple] = {}  # worker -> (index, seconds, stack) when we killed it
        self._stuck: dict[int, Stuck] = {}
        self._noted_stuck: set[int] = set()
        self._last_check = 0.0
        self._oom_before = _cgroup.oom_kills()
        self.restarts = [0] * num_workers
        self._closed = False

    # -- processes -------------------------------------------------------------------------------
    @property
    def processes(self) -> list:
        """The latest process of each worker (multiprocessing.Process: ``.pid``, ``.is_alive()``,
        ``.join()``), by worker id, as torch's iterator keeps them in ``_workers``: ended ones
        stay listed until a restart replaces them. A copy, so a reader in another thread never sees it change."""
        with self._lock:
            return [p for p in self._last_procs if p is not None]

    def pid(self, worker_id: int):
        p = self._procs[worker_id]
        return p.pid if p is not None else None

    def has(self, worker_id: int) -> bool:
        return self._sup.has_worker(worker_id)

    def start_all(self, count: int | None = None) -> None:
        """Starts workers 0..count-1 (all of them by default; num_workers="auto" starts the
        others when it needs them)."""
        if self._method == "fork":
            self._warn_other_threads()
        for w in range(self._num_workers if count is None else count):
            self.start(w)

    def _warn_other_threads(self) -> None:
        names = _other_threads()
        if names:
            warnings.warn(
                f"stoker: forking DataLoader workers while this process runs other threads "
                f"({', '.join(names[:8])}{'...' if len(names) > 8 else ''}). A lock one of them "
                "holds at the fork stays locked forever in the workers, which can hang them at "
                "start-up or on their first sample (stoker names such a worker). If workers "
                "hang, pass multiprocessing_context='forkserver' (or 'spawn').",
                RuntimeWarning, stacklevel=5,
            )

    def start(self, worker_id: int) -> None:
        main_end, child_end = _stoker.channel_pair()
        _fdpass._pending.update((main_end, child_end))
        try:
            proc = self._ctx.Process(
                target=_worker.worker_main,
                args=(_fdpass.ChannelFd(child_end), worker_id) + self.worker_args,
                daemon=True,
            )
            proc.start()
        except BaseException:
            _fdpass._pending.difference_update((main_end, child_end))
            os.close(main_end)
            os.close(child_end)
            raise
        _fdpass._pending.difference_update((main_end, child_end))
        os.close(child_end)
        with self._lock:
            self._sup.add_worker(worker_id, main_end, proc.pid)
            self._procs[worker_id] = proc
            self._last_procs[worker_id] = proc
            self._started_at[worker_id] = time.monotonic()
            self._leaving.discard(worker_id)  # an earlier process of this id was stopped
            self._stuck.pop(worker_id, None)
            self._noted_stuck.discard(worker_id)

    def stop(self, worker_id: int) -> None:
        """Closes the worker's channel: its watchdog ends it at once; its exit is expected."""
        with self._lock:
            self._leaving.add(worker_id)
            self._sup.remove_worker(worker_id)

    def shutdown(self) -> None:
        """Ends every worker and reaps it (idempotent, any thread)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            procs = [p for p in self._procs if p is not None]
            for w in range(self._num_workers):
                self._sup.remove_worker(w)  # closing the channel ends the worker
            self._procs = [None] * self._num_workers
        deadline = time.monotonic() + EXIT_GRACE_S
        for proc in procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join()

    # -- messages --------------------------------------------------------------------------------
    def send(self, worker_id: int, mtype: int, task: int, a: int = 0, payload: bytes = b"") -> bool:
        """False when the worker is gone (its death is reported by the next wait)."""
        # Stamped before sending: a worker that takes the message enters its next state after it.
        sent_at = time.monotonic()
        try:
            self._sup.send(worker_id, mtype, task, a, payload)
        except EngineError:
            return False
        self._last_send[worker_id] = sent_at
        return True

    def wait(self, timeout_s):
        """The next message ``("message", worker, type, task, a, b, c, payload, pending)``, an
        ``Exit`` for a worker that died unexpectedly, or None after `timeout_s` seconds."""
        ev = self._sup.wait(timeout_s)
        if ev is None or ev[0] != "died":
            return ev
        return self._on_exit(ev)

    def _on_exit(self, ev):
        _, worker_id, exit_code, signum, core = ev
        with self._lock:
            proc = self._procs[worker_id]
            leaving = worker_id in self._leaving
            self._leaving.discard(worker_id)
            status = None if leaving else (self._sup.status(worker_id) or {})
            crash_log = "" if leaving else self._sup.read_log(worker_id, _protocol.LOG_CRASH, 1 << 16)
            stderr_tail = "" if leaving else self._sup.read_log(worker_id, _protocol.LOG_STDERR, 8192)
            self._sup.remove_worker(worker_id)
            self._procs[worker_id] = None
            stuck = self._stuck.pop(worker_id, None)
        if proc is not None:
            proc.join(timeout=EXIT_GRACE_S)
            # multiprocessing may have reaped it first (Process.start() reaps finished children),
            # in which case only it knows the status.
            if proc.exitcode is not None:
                signum, exit_code = (-proc.exitcode, None) if proc.exitcode < 0 else (0, proc.exitcode)
        if leaving:
            return None
        pid = proc.pid if proc is not None else status.get("pid")
        hung = self._hung.pop(worker_id, None)
        busy = status.get("state") in _BUSY
        index = hung[0] if hung else (status.get("index") if busy else None)
        oom_now = _cgroup.oom_kills()
        oom = signum == signal.SIGKILL and hung is None and any(
            b is not None and a is not None and a > b for a, b in zip(oom_now, self._oom_before)
        )
        self._oom_before = oom_now
        cause, explanation = _deaths.describe(
            signum, exit_code, core, oom=oom, rss=status.get("rss_bytes"), index=index,
            crash_log=crash_log, stderr_tail=stderr_tail,
            hung=(hung[1], hung[2]) if hung else None,
            stuck=stuck.describe() if stuck is not None and hung is not None else None,
        )
        return Exit(worker_id, pid, signum, None if signum else exit_code, cause, explanation,
                    index, busy, hung is not None, bool(status) or hung is not None,
                    outside=signum == signal.SIGKILL and not oom and hung is None,
                    task=status.get("task") if busy or hung else None,
                    position=status.get("position") if busy or hung else None)

    # -- watching --------------------------------------------------------------------------------
    def check(self, queued: dict[int, int], hang_timeout) -> None:
        """Looks for hangs (a sample that takes longer than `hang_timeout`) and for workers that
        do not take the work queued to them (`queued`: worker -> tasks); at most every
        CHECK_EVERY_S. Hung workers are killed (their death then comes through wait())."""
        now = time.monotonic()
        if now - self._last_check < CHECK_EVERY_S:
            return
        self._last_check = now
        for w in range(self._num_workers):
            if w in self._hung or not self._sup.has_worker(w):
                continue
            st = self._sup.status(w)
            pid = self.pid(w)
            stopped = _proc_state(pid) in ("T", "t")
            if st is not None and st["state"] in _BUSY and not stopped:
                self._stuck.pop(w, None)
                limit = hang_timeout
                if limit is not None and st["state"] == "encoding":
                    # Writing a batch takes milliseconds; a long stay here is the worker waiting
                    # for the user to free shared memory (max_shared_memory), which ends in
                    # SharedMemoryLimitError after its own patience, not a hang.
                    limit = max(limit, 2 * _worker.SHARED_MEMORY_PATIENCE_S)
                if limit is not None and st["state_seconds"] > limit:
                    self._kill_hung(w, st["index"], st["state_seconds"])
                continue
            waiting = self._not_taking_work(w, pid, st, stopped, queued.get(w, 0), now)
            if waiting is None:
                self._stuck.pop(w, None)
                continue
            limit = hang_timeout
            if limit is not None and not waiting.stopped and waiting.state in ("starting",
                                                                               "not started"):
                limit = max(limit, STARTUP_GRACE_S)
            if limit is not None and waiting.seconds > limit:
                self._stuck[w] = waiting
                self._kill_hung(w, None, waiting.seconds)
            elif waiting.seconds > NOT_TAKING_WORK_S or (waiting.stopped and waiting.seconds > 1):
                self._stuck[w] = waiting
                if w not in self._noted_stuck:
                    self._noted_stuck.add(w)
                    if not waiting.stopped:
                        waiting.stack = self.capture_stack(w)
                    log.warning("stoker: DataLoader %s. The training loop waits for it; set "
                                "hang_timeout to have stoker restart such workers and re-issue "
                                "their work.", waiting.describe())

    def _not_taking_work(self, w, pid, st, stopped, queued, now):
        """A Stuck when `w` has a message it has not taken (a task, a new epoch) or is stopped.

        A worker takes a message the moment it is idle (it enters "idle", then reads its
        channel), so one that entered its current idle or starting state *after* the last message
        went to it has taken everything, however long it has idled since (the training loop may
        have paused for an evaluation: results waiting in the channel are not work). One that
        went idle before the last message and is still idle has not read it: it has been stuck
        at least since that message was sent."""
        if queued == 0:
            return None
        if stopped:
            seconds = st["state_seconds"] if st is not None else now - self._started_at[w]
        elif st is None or st["state"] in ("idle", "starting"):
            # (a clock read after the status read: never earlier than the true entry time)
            entered = (time.monotonic() - st["state_seconds"] if st is not None
                       else self._started_at[w])
            if entered >= self._last_send[w]:
                return None
            seconds = now - self._last_send[w]
        else:
            return None
        if seconds <= 0.5:
            return None
        return Stuck(w, pid, st["state"] if st else "not started", stopped, seconds, queued)

    def stuck(self) -> dict[int, Stuck]:
        return dict(self._stuck)

    def _kill_hung(self, w, index, seconds) -> None:
        stack = self.capture_stack(w)
        self._hung[w] = (index, seconds, stack)
        try:
            self._sup.signal(w, signal.SIGKILL)
        except EngineError:
            pass

    def capture_stack(self, worker_id: int, wait_s: float = 1.0) -> str:
        """Asks the worker for its Python stack (faulthandler on DUMP_SIGNAL) and returns it
        ('' when it cannot answer: not started yet, stopped, or gone)."""
        if _proc_state(self.pid(worker_id)) in ("T", "t") or self._sup.status(worker_id) is None:
            # Stopped, or not yet past the point where it installs its faulthandler (it shares
            # its crash log before its status page): the signal would kill it, not answer.
            return ""
        st = self._sup.status(worker_id)
        if st is None or st["state"] == "starting":
            # Its faulthandler may not be installed yet, and DUMP_SIGNAL's default kills.
            return ""
        before = self._sup.read_log(worker_id, _protocol.LOG_CRASH, 1 << 20)
        try:
            self._sup.signal(worker_id, _worker.DUMP_SIGNAL)
        except EngineError:
            return ""
        end = time.monotonic() + wait_s
        text = before
        while time.monotonic() < end:
            time.sleep(0.02)
            text = self._sup.read_log(worker_id, _protocol.LOG_CRASH, 1 << 20)
            if len(text) > len(before) and text.endswith("\n"):
                time.sleep(0.02)
                text = self._sup.read_log(worker_id, _protocol.LOG_CRASH, 1 << 20)
                break
        new = text[len(before):] if text.startswith(before) else text
        return _deaths.trim_stack(new.strip())

    # -- reading (any thread) -------------------------------------------------------------------
    def status(self, worker_id: int):
        with self._lock:
            return self._sup.status(worker_id) if self._sup.has_worker(worker_id) else None

    def slot_usage(self) -> dict:
        return self._sup.slot_usage()

    def stats(self) -> list[dict]:
        out = []
        with self._lock:
            for w in range(self._num_workers):
                st = self._sup.status(w) if self._sup.has_worker(w) else None
                proc = self._procs[w]
                entry = {"id": w, "pid": proc.pid if proc is not None else None,
                         "alive": bool(st), "restarts": self.restarts[w]}
                if st:
                    entry.update({
                        "state": st["state"], "index": st["index"], "task": st["task"],
                        "samples": st["samples"], "batches": st["batches"],
                        "rss_bytes": st["rss_bytes"], "bytes_sent": st["bytes_sent"],
                        "seconds": {"getitem": st["seconds_in"]["loading"],
                                    "collate": st["seconds_in"]["collating"],
                                    "encode": st["seconds_in"]["encoding"],
                                    "idle": st["seconds_in"]["idle"]},
                    })
                stuck = self._stuck.get(w)
                if stuck is not None:
                    entry["stuck"] = stuck.describe()
                out.append(entry)
        return out

    def seconds_in(self) -> dict:
        """Seconds all live workers spent in each state."""
        totals: dict = {}
        for w in range(self._num_workers):
            st = self.status(w)
            for k, v in (st or {}).get("seconds_in", {}).items():
                totals[k] = totals.get(k, 0.0) + v
        return totals
