"""What the main process keeps of one worker's actor: one record per actor, in place of tables
keyed by worker id.

Thread contract: a record is read and changed under its placement's lock (``RayWorkers``), by
the iterating thread; readers on other threads copy what they need under the same lock.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field

from ... import _stoker
from ..base import Hung


@dataclass
class Call:
    """One message sent to the actor, as one actor call, until its result is in hand."""

    ref: object  # the call's object ref
    kind: str  # "task", "epoch" or "control"
    task: int  # the task (or epoch) number it carries
    sent_at: float  # time.monotonic() when it was sent


@dataclass
class Waiting:
    """A task held back in this process while the worker's batches fill its memory share."""

    task: int
    fmt: int
    payload: bytes
    serial: bool  # its samples load one at a time (protocol.Task.serial)
    since: float  # time.monotonic() when it was first held back


@dataclass
class ActorRecord:
    """One worker id's actor, from its start until its end is seen (or it is stopped)."""

    handle: object  # the Ray actor handle
    config: object  # the WorkerConfig it started with
    started_at: float = field(default_factory=time.monotonic)
    ready: object = None  # its ready() call while it starts; None once it answered
    info: dict = field(default_factory=dict)  # "pid", "node", "node_id" once ready
    calls: collections.deque = field(default_factory=collections.deque)  # Calls, in order sent
    waiting: collections.deque = field(default_factory=collections.deque)  # Waiting tasks
    snap: dict = field(default_factory=dict)  # its status after its last call
    live: dict | None = None  # a status asked for since (capture_stack)
    last_sent: float = 0.0  # time.monotonic() when a call last went to it
    done_at: float = field(default_factory=time.monotonic)  # when its last result came back
    hung: Hung | None = None  # killed on purpose for a hang: its death is named with it
    back: bool = False  # a lost worker started again: WorkerReady once it is up

    def status(self, now: float) -> dict | None:
        """Its status as this process knows it now: the actor's last report, with what happened
        since (while calls wait it is busy with the first of them, since the one before ended);
        None before it made any report and while it starts."""
        snap = dict(self.live or self.snap or {})
        if self.ready is not None:
            snap.update(state="starting", state_seconds=now - self.started_at)
        elif self.calls:
            since = max(self.done_at, self.calls[0].sent_at)
            snap.update(state="loading", state_seconds=now - since)
            snap.setdefault("index", None)
        elif snap:
            snap.update(state="idle", state_seconds=now - self.done_at)
        else:
            return None
        snap.setdefault("seconds_in", dict.fromkeys(_stoker.WORKER_STATES, 0.0))
        for key, default in (("rss_bytes", 0), ("index", None),
                             ("position", None), ("task", 0), ("samples", 0), ("batches", 0),
                             ("bytes_sent", 0)):
            snap.setdefault(key, default)
        return snap
