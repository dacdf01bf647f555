"""The deaths only the node placement has, named in one place (as ``ray/deaths.py`` names an
actor's): a pool that ended under a rank, a group whose workers cannot be started again, a hang
whose task no pool worker was loading, a message the pool could not handle. A pool worker's own
death is named by the local placement that runs it (``placements/local.py``), exactly as a
rank's own worker's would be; the pool only re-addresses it (``for_rank``).

Each returns an ``events.WorkerExited`` built with keywords. Pure functions; any thread.
"""

from __future__ import annotations

import dataclasses
import os
import signal

from ...common import deaths as _deaths
from ...wire import protocol
from ...wire.events import WorkerExited


def for_rank(ev: WorkerExited, w: int, task: int | None) -> WorkerExited:
    """A pool worker's death `ev` as the rank's virtual worker `w` sees it (its task number
    `task` in the rank's iterator; None when the death concerned no task)."""
    return dataclasses.replace(ev, worker=w, task=task if ev.task is not None else None)


def cannot_restart(ev: WorkerExited) -> WorkerExited:
    """`ev`, a death at start-up of a group whose workers keep failing to start: the ranks must
    not start it again (the pool did, and it failed each time)."""
    return dataclasses.replace(ev, restartable=False)


def pool_ended(w: int, pool_pid: int | None, busy: bool) -> WorkerExited:
    """The rank's connection to its pool ended (the pool exited or was killed): every virtual
    worker died with it; the rank restarts them, which starts a new pool."""
    cause = f"ended with the node's worker pool (pid {pool_pid}), which exited or was killed"
    return WorkerExited(
        worker=w, pid=pool_pid, signum=0, exit_code=None, cause=cause,
        explanation=(f"worker {w} {cause}: its tasks are re-issued; a new pool starts when the "
                     "loader starts its workers again."),
        index=None, busy=busy, hung=False, started=True, outside=False)


def group_lost(error: BaseException) -> WorkerExited:
    """The pool's workers for this dataset could not go on (they could not be started again, a
    slot was found overwritten): nothing can be restarted in their place."""
    cause = (f"was lost with the node pool's workers for this dataset: "
             f"{type(error).__name__}: {protocol.safe_str(error)}")
    return WorkerExited(
        worker=-1, pid=None, signum=0, exit_code=None, cause=cause,
        explanation=f"a worker {cause}", index=None, busy=False, hung=False, started=True,
        outside=False, restartable=False)


def hung_without_worker(w: int, hung) -> WorkerExited:
    """The rank's hang watch gave up on virtual worker `w`, but no pool worker was loading its
    task (it finished meanwhile, or never reached a worker): a death all the same, so that the
    rank re-issues its work (a kill always ends in a death)."""
    cause, explanation = _deaths.describe_hang(hung.seconds, hung.stack, index=hung.index,
                                               stuck=hung.stuck)
    return WorkerExited(
        worker=w, pid=None, signum=signal.SIGKILL, exit_code=None, cause=cause,
        explanation=explanation, index=hung.index, busy=False, hung=True, started=True,
        outside=False)


def where_tracebacks_go() -> str:
    """Where the pool's own tracebacks are printed (called in the pool): its stderr, the one of
    the rank that started it."""
    return (f"the traceback is on the standard error of the rank that started the node pool "
            f"(pool pid {os.getpid()})")


def message_failed(w: int, message, error: BaseException) -> WorkerExited:
    """The pool could not handle `message` for virtual worker `w` (a bug of the pool's, or a
    message it cannot read): the rank hears of it as a death of `w`, so that it re-issues the
    work under its restart policy instead of waiting for an answer that will not come."""
    cause = (f"lost a {type(message).__name__.lower()} the node pool could not handle: "
             f"{type(error).__name__}: {protocol.safe_str(error)}")
    return WorkerExited(
        worker=w, pid=None, signum=0, exit_code=None, cause=cause,
        explanation=f"worker {w} {cause}. Its tasks are re-issued; {where_tracebacks_go()}.",
        index=None, busy=True, hung=False, started=True, outside=False)
