"""Watching workers for hangs: a sample that takes longer than ``hang_timeout``, and a worker that
does not take the work queued to it (deadlocked at start-up on a lock inherited at fork, stopped
by a debugger or a cgroup freezer).

It reads the workers through the placement's interface only (``Workers.view``: status, stopped,
last message sent, start time; and the stack) and, past ``hang_timeout``, has the placement kill
the worker with the reason (``Workers.kill``), so that the death is named with it and handled as
any death.

Thread contract: ``check`` and ``forget`` are called by the thread that iterates; ``stuck`` may be
called from any thread (it returns a copy).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from ...common.errors import WorkerHung
from ...placements.base import STARTUP_GRACE_S, Hung
from ...worker import loop as _loop

log = logging.getLogger("stoker")

# How often status pages are checked for hangs and workers that do not take their work.
CHECK_EVERY_S = 0.1
# A worker with work queued that has not started it for this long is named (stall notice,
# stats(), one log line); with hang_timeout it is handled as a hang once that passes.
NOT_TAKING_WORK_S = 5.0
BUSY = ("loading", "collating", "encoding")


@dataclass
class Stuck:
    """A worker that has work queued but does not take it."""

    worker_id: int
    pid: int | None
    state: str  # what its status page says (idle, starting...) or "not started"
    stopped: bool  # it cannot run (SIGSTOP, a debugger, a cgroup freezer)
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


class HangWatch:
    def __init__(self, workers):
        self._workers = workers
        self._killed: set[int] = set()  # killed for a hang; their death is on its way
        self._stuck: dict[int, Stuck] = {}
        self._noted: set[int] = set()  # stuck workers already named in the log
        self._last_check = 0.0

    def forget(self, worker_id: int) -> None:
        """The worker ended or was started again: what was known of it is past."""
        self._killed.discard(worker_id)
        self._stuck.pop(worker_id, None)
        self._noted.discard(worker_id)

    def stuck(self) -> dict[int, Stuck]:
        return dict(self._stuck)

    def check(self, queued: dict[int, int], hang_timeout) -> None:
        """Looks for hangs (a sample that takes longer than `hang_timeout`) and for workers that
        do not take the work queued to them (`queued`: worker -> messages not answered yet); at
        most every CHECK_EVERY_S. Hung workers are killed (their death then comes through the
        placement's wait)."""
        now = time.monotonic()
        if now - self._last_check < CHECK_EVERY_S:
            return
        self._last_check = now
        ws = self._workers
        for w in range(ws.num_workers):
            if w in self._killed:
                continue
            v = ws.view(w)
            if v is None:  # stopped (its stream ended, a shutdown): nothing to watch
                self._stuck.pop(w, None)
                continue
            st = v.status
            if st is not None and st["state"] in BUSY and not v.stopped:
                self._stuck.pop(w, None)
                limit = hang_timeout
                if limit is not None and st["state"] == "encoding":
                    # Writing a batch takes milliseconds; a long stay here is the worker waiting
                    # for the user to free shared memory (max_shared_memory), which ends in
                    # SharedMemoryLimitError after its own patience, not a hang.
                    limit = max(limit, 2 * _loop.SHARED_MEMORY_PATIENCE_S)
                if limit is not None and st["state_seconds"] > limit:
                    stack = ws.capture_stack(w)
                    after = ws.view(w)  # (a remote worker's status is fresher after it)
                    st = after.status if after is not None and after.status else st
                    self._kill(w, Hung(st["index"], st["state_seconds"], stack))
                continue
            waiting = self._not_taking_work(w, v, queued.get(w, 0), now)
            if waiting is None:
                self._stuck.pop(w, None)
                continue
            limit = hang_timeout
            if limit is not None and not waiting.stopped and waiting.state in ("starting",
                                                                               "not started"):
                limit = max(limit, STARTUP_GRACE_S)
            if limit is not None and waiting.seconds > limit:
                self._stuck[w] = waiting
                self._kill(w, Hung(None, waiting.seconds, ws.capture_stack(w),
                                   stuck=waiting.describe()))
            elif waiting.seconds > max(NOT_TAKING_WORK_S, ws.start_grace_s
                                       if waiting.state in ("starting", "not started") else 0) \
                    or (waiting.stopped and waiting.seconds > 1):
                self._stuck[w] = waiting
                if w not in self._noted:
                    self._noted.add(w)
                    if not waiting.stopped:
                        waiting.stack = ws.capture_stack(w)
                    log.warning("stoker: DataLoader %s. The training loop waits for it; set "
                                "hang_timeout to have stoker restart such workers and re-issue "
                                "their work.", waiting.describe())

    def _kill(self, w: int, hung: Hung) -> None:
        self._killed.add(w)
        self._workers.kill(w, hung)

    def _not_taking_work(self, w, v, queued, now):
        """A Stuck when `w` (its view `v`) has a message it has not taken (a task, a new epoch)
        or is stopped.

        A worker takes a message the moment it is idle (it enters "idle", then reads its
        channel), so one that entered its current idle or starting state *after* the last message
        went to it has taken everything, however long it has idled since (the training loop may
        have paused for an evaluation: results waiting in the channel are not work). One that
        went idle before the last message and is still idle has not read it: it has been stuck
        at least since that message was sent."""
        if queued == 0:
            return None
        st = v.status
        if v.stopped:
            seconds = st["state_seconds"] if st is not None else now - v.started_at
        elif st is None or st["state"] in ("idle", "starting"):
            # (a clock read after the status read: never earlier than the true entry time)
            entered = (time.monotonic() - st["state_seconds"] if st is not None
                       else v.started_at)
            if entered >= v.last_sent:
                return None
            seconds = now - v.last_sent
        else:
            return None
        if seconds <= 0.5:
            return None
        return Stuck(w, v.pid, st["state"] if st else "not started", v.stopped, seconds, queued)

    def timeout_error(self, timeout, task: int, worker_id) -> WorkerHung:
        """torch's "DataLoader timed out after N seconds", with the worker that holds `task`
        (or, at an epoch's start, that has not answered), what it is doing and its stack."""
        ws = self._workers
        msg = f"DataLoader timed out after {timeout} seconds"
        v = ws.view(worker_id) if worker_id is not None else None
        if v is None:
            return WorkerHung(msg, worker_id=None, pid=None, index=None, stack="")
        w = worker_id
        st = v.status or {}
        pid = v.pid
        index = st.get("index")
        stuck = self._stuck.get(w)
        if stuck is not None:
            if not stuck.stack and not stuck.stopped:
                stuck.stack = ws.capture_stack(w)
            stack = stuck.stack
            msg += f": waiting for batch {task}; {stuck.describe()}"
        else:
            stack = ws.capture_stack(w)
            doing = st.get("state", "working")
            msg += (
                f": waiting for batch {task} from worker {w} (pid {pid}), which has been "
                f"{doing} for {st.get('state_seconds', 0):.1f} s"
                + (f" on dataset index {index!r}" if index is not None else "")
                + "."
            )
            if stack:
                msg += f"\nIts Python stack now:\n{stack}"
        msg += (
            "\nWhat to do: find what that sample waits on (I/O, a lock, a subprocess); raise "
            "timeout if it is legitimately slow, or set hang_timeout to restart such workers."
        )
        return WorkerHung(msg, worker_id=w, pid=pid, index=index, stack=stack)
