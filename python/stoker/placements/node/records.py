"""The records a ``Group`` keeps (group.py): one per pool worker, per client, per task, each
changed only by the group, under its lock.

- ``PoolWorker``: one process slot of the group: the process in it, the task it loads, the seed
  it is set to, its deaths at start-up in a row (which decide when it starts again, and when
  the group is broken);
- ``Client``: one rank's iterator: its queue of tasks, the incarnations of its virtual workers it
  forgot (how far behind its rank is, the pool counts: ``Pool.tally``);
- ``Task``: one distinct task, queued or running: the ranks that asked for it (``Asker``s).

Plain records: no I/O, no locks of their own.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import time

from ..base import STARTUP_GRACE_S

# A start-up that raises (an unpicklable class, a worker_init_fn that fails: deterministic) three
# times in a row breaks the group. A worker killed by a signal while starting (the OOM killer
# choosing the newest process, an operator, a chaos test) says nothing of its next start: it is
# started again, after a growing pause when it keeps dying (never a hot loop), and the group
# breaks only when no worker of it has loaded anything for STARTUP_GRACE_S through at least
# START_KILLS_BROKEN such deaths (a crash at every import).
START_DEATHS_BROKEN = 3
START_KILLS_BROKEN = 10
_numbers = itertools.count(1)


@dataclasses.dataclass(frozen=True)
class Asker:
    """One rank's request for a task: its connection, virtual worker, that worker's
    incarnation, and the task's number in that rank's iterator."""

    cid: int
    w: int
    gen: int
    task: int

    def of(self, cid: int, w: int, gen: int) -> bool:
        """Whether it is a request of that virtual worker, up to that incarnation."""
        return self.cid == cid and self.w == w and self.gen <= gen


@dataclasses.dataclass(eq=False)
class Task:
    ident: tuple  # (base seed, epoch, index format, index bytes)
    fmt: int
    payload: bytes
    askers: list
    number: int = dataclasses.field(default_factory=lambda: next(_numbers))
    worker: PoolWorker | None = None  # the pool worker loading it
    began: bool = False  # the ranks heard that a started worker took it
    sent_at: float = 0.0  # when it went to its worker
    killed: bool = False  # its worker was killed for not finishing its start-up
    # a rank re-issued it after a death with its samples in flight (wire.Task.serial)
    one_at_a_time: bool = False

    def waited(self) -> float:
        return time.monotonic() - self.sent_at


@dataclasses.dataclass(eq=False)
class PoolWorker:
    """One process slot of the group (its id in ``LocalProcesses``)."""

    slot: int
    alive: bool = False  # a process runs in it (started, its end not yet seen)
    lost: bool = False  # a task could not be sent to it: it is ending (its death is coming)
    pid: int | None = None
    task: Task | None = None
    seed: tuple | None = None  # the (base seed, epoch) it is set to
    start_deaths: int = 0  # ended with a status before it started, in a row
    start_kills: int = 0  # killed by a signal before it started, in a row
    restart_at: float = 0.0  # not started again before this (a pause after deaths)

    def idle(self) -> bool:
        return self.alive and not self.lost and self.task is None

    def startable(self, now: float) -> bool:
        return not self.alive and self.restart_at <= now

    def started(self, pid: int | None, seed: tuple) -> None:
        self.alive, self.lost, self.pid, self.seed = True, False, pid, seed

    def ended(self, started: bool, signalled: bool) -> Task | None:
        """Its process ended (`started`: past its start-up; `signalled`: killed by a signal);
        returns the task it was loading. Counts deaths at start-up and sets the pause before
        it starts again (0.1 s, 0.2 s, ... at most 2 s, from the fourth kill in a row)."""
        task, self.task, self.alive, self.lost, self.pid = self.task, None, False, False, None
        if not started:
            if signalled:
                self.start_kills += 1
            else:
                self.start_deaths += 1
        if self.start_kills > 3:
            self.restart_at = time.monotonic() + min(2.0, 0.1 * 2 ** (self.start_kills - 4))
        return task

    def loaded(self) -> None:
        """An outcome: it is past its start-up."""
        self.task = None
        self.start_deaths = self.start_kills = 0


def breaks_group(workers: list, progress_at: float) -> bool:
    """Whether the group's workers keep failing to start (the rule above)."""
    return any(pw.start_deaths >= START_DEATHS_BROKEN for pw in workers) or (
        sum(pw.start_kills for pw in workers) >= START_KILLS_BROKEN
        and time.monotonic() - progress_at > STARTUP_GRACE_S)


@dataclasses.dataclass(eq=False)
class Client:
    """One rank's iterator attached to the group (`rank`: its process's pid)."""

    cid: int
    rank: int
    queue: collections.deque = dataclasses.field(default_factory=collections.deque)
    forgotten: dict = dataclasses.field(default_factory=dict)  # w -> the incarnation that died

    def forgot(self, w: int, gen: int) -> bool:
        """Whether incarnation `gen` of its virtual worker `w` is forgotten (it died)."""
        return self.forgotten.get(w, -1) >= gen

    def head(self) -> Task | None:
        """Its next task anyone still wants (dropping those nobody does)."""
        while self.queue and not self.queue[0].askers:
            self.queue.popleft()
        return self.queue[0] if self.queue else None
