"""What a worker tells the main process, as named events: what every placement delivers.

A placement (``placements/``) turns its own transport into these, so the iterator above it reads
the same events whether a worker is a local process or runs elsewhere. ``task`` numbers follow
the sampler's order (``loader/iterators/tasks.py``); ``worker`` is the worker's id.

An outcome ends a task: ``BatchReady``, ``TaskFailed``, or ``SamplesSkipped`` with ``dropped``
(every sample of the task was skipped, there is no batch). ``SamplesSkipped`` without
``dropped`` comes just before the batch it belongs to, ``StreamState`` just before the outcome
it goes with.

Plain values: made by the thread that waits on the placement, read by it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from . import protocol


class Event:
    __slots__ = ("worker", "task")

    def __init__(self, worker: int, task: int):
        self.worker = worker
        self.task = task

    def __repr__(self):
        fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in _slots(type(self)))
        return f"{type(self).__name__}({fields})"


def _slots(cls):
    out = []
    for c in reversed(cls.__mro__):
        out.extend(getattr(c, "__slots__", ()))
    return out


class BatchHandle(Protocol):
    """What ``BatchReady.batch`` is, whatever the placement: the local placement's
    ``PendingBatch`` (a slot of this process's supervisor), ``buffer_batch.BufferBatch`` (the
    node pool's slot, a Ray object). The iterating thread calls one of the two, once."""

    def decode(self) -> object:
        """The batch (tensor views of its buffer; the buffer goes back when the last view
        dies)."""

    def discard(self) -> None:
        """Gives the buffer back without building anything."""


class BatchReady(Event):
    """The batch of `task` is ready: ``batch.decode()`` builds it (tensor views of its buffer),
    ``batch.discard()`` gives the buffer back without building anything (``BatchHandle``)."""

    __slots__ = ("batch",)

    def __init__(self, worker: int, task: int, batch: BatchHandle):
        super().__init__(worker, task)
        self.batch = batch


class TaskFailed(Event):
    """The user's code raised while loading `task`: ``report`` is the dict that
    ``protocol.encode_error`` made (type, message, traceback, worker, index)."""

    __slots__ = ("report",)

    def __init__(self, worker: int, task: int, report: dict):
        super().__init__(worker, task)
        self.report = report


class SamplesSkipped(Event):
    """Samples of `task` were skipped (``on_error="skip"``): ``records`` is [(index, reason)];
    ``dropped``: none was left, the task has no batch."""

    __slots__ = ("records", "dropped")

    def __init__(self, worker: int, task: int, records: list, dropped: bool):
        super().__init__(worker, task)
        self.records = records
        self.dropped = dropped


class StreamState(Event):
    """The worker's state after `task` (``stream_state.capture``: plain data, its generators
    raw)."""

    __slots__ = ("state",)

    def __init__(self, worker: int, task: int, state: dict):
        super().__init__(worker, task)
        self.state = state


class StreamEnded(Event):
    """The worker's IterableDataset ran out while loading `task` (it ignores later tasks)."""

    __slots__ = ()


class EpochBegun(Event):
    """A persistent worker took a new epoch (``task`` is the epoch's number)."""

    __slots__ = ()


class WorkerLost(Event):
    """The worker cannot run now (its replacement found no room on the cluster): its work
    should go to the others. ``task`` is unused (-1)."""

    __slots__ = ("reason",)

    def __init__(self, worker: int, reason: str):
        super().__init__(worker, -1)
        self.reason = reason


class WorkerReady(Event):
    """A worker that was lost runs again and may take work. ``task`` is unused (-1)."""

    __slots__ = ()

    def __init__(self, worker: int):
        super().__init__(worker, -1)


def is_outcome(ev) -> bool:
    """True for the events that end a task."""
    return isinstance(ev, (BatchReady, TaskFailed)) or (
        isinstance(ev, SamplesSkipped) and ev.dropped)


@dataclass
class WorkerExited:
    """A worker's unexpected end, named by its placement."""

    worker: int
    pid: int | None  # the process (local placement), or the remote process's pid when known
    signum: int  # 0 when it exited
    exit_code: int | None
    cause: str  # short, without the index ("was killed by signal SIGSEGV (...)")
    explanation: str  # the cause with what to do
    index: object  # the dataset index it was loading when it died, if known
    busy: bool  # it was loading, collating or encoding
    hung: bool  # killed on purpose for a hang (``Workers.kill``)
    started: bool  # it got past start-up
    outside: bool  # a SIGKILL that neither the loader nor the OOM killer explains
    task: int | None = None  # the task it was working on, and the position of the sample in
    position: int | None = None  # it: they name a sample whose index is not an int
    # It ended on its own before it started (an exception while unpickling the dataset or in
    # worker_init_fn; for Ray, in the actor's creation): a new one would fail the same way.
    # A start-up ended from outside (a signal: the OOM killer, an operator) is not that.
    start_failed: bool = False
    # Its placement can start no worker in its place (the node pool's workers for this dataset
    # kept failing, or were lost): the run ends with this death, whatever the restart policy.
    restartable: bool = True


def from_message(worker: int, mtype: int, task: int, a: int, payload, batch):
    """The event of one worker message (``protocol.MSG_*``, its task, its `a` field, its
    payload); `batch` is what a ``BatchReady`` carries (the placement's handle on the batch's
    bytes). None for a message that is no event."""
    if mtype == protocol.MSG_BATCH:
        return BatchReady(worker, task, batch)
    if mtype == protocol.MSG_ITER_STATE:
        return StreamState(worker, task, protocol.decode_stream_state(payload))
    if mtype == protocol.MSG_SKIPPED:
        return SamplesSkipped(worker, task, protocol.decode_skipped(payload), a == 1)
    if mtype == protocol.MSG_ERROR:
        return TaskFailed(worker, task, protocol.decode_error(payload))
    if mtype == protocol.MSG_END:
        return StreamEnded(worker, task)
    if mtype == protocol.MSG_RESUMED:
        return EpochBegun(worker, task)
    return None
