"""Batches on the device, copied while the user trains on the one before (the ``device`` option).

``DeviceStage.next()`` hands out the batch whose copy was queued on the previous call and queues
the copy of the next one, so a copy overlaps the user's step. The synchronisation, which is what
hand-written prefetchers get wrong (docs/design/gpu.md):

- copies run on the stage's own stream; each batch's copy ends with an event;
- the stream current when the user receives a batch waits on that event (on the GPU: the CPU
  never waits for a copy on this path), and every tensor handed out is recorded on that stream
  (``record_stream``), so the caching allocator does not give its memory to a later copy while
  the user's kernels still read it;
- the host batch the copy reads (slot views) is held until the copy's event has passed, and only
  then dropped, which hands its slot back to the worker: a worker never writes into a slot a copy
  still reads.

What the loader must do when a batch reaches the user (the position a checkpoint saves, skips)
happens when the stage hands the batch out, not when it pulled it from the workers: work noted
with ``defer()`` rides with the next batch pulled and runs as that batch is handed out. So a
checkpoint never counts a batch that is still being copied, and a resumed run loads it again. An
error or the end of the epoch found while pulling ahead is raised when its turn comes.

Thread contract: the thread that iterates; ``finish_copies()`` also from another (shutdown).
"""

from __future__ import annotations

import collections
import threading

from .runtime import CudaRuntime
from .tree import map_tensors

AHEAD = 1  # batches whose copy is queued beyond the one handed out

_BATCH, _ERROR, _END = 0, 1, 2


class _Item:
    __slots__ = ("kind", "value", "event", "tensors", "notes")

    def __init__(self, kind, value, event, tensors, notes):
        self.kind, self.value, self.event, self.tensors, self.notes = (
            kind, value, event, tensors, notes)


class DeviceStage:
    def __init__(self, runtime: CudaRuntime, device_spec: str, pull):
        """`pull()`: the next host batch (pinned); raises StopIteration at the end of the
        epoch."""
        self._rt = runtime
        self._spec = device_spec
        self._pull = pull
        self._device = None
        self._stream = None
        self._queue: collections.deque[_Item] = collections.deque()
        self._notes: list = []  # noted since the last pull
        self._reading: collections.deque = collections.deque()  # (event, host batch)
        self._lock = threading.Lock()  # finish_copies() may come from another thread

    def defer(self, fn, *args) -> None:
        """Runs `fn(*args)` when the next batch pulled reaches the user."""
        self._notes.append((fn, args))

    def next(self):
        self._retire()
        if not self._queue:
            self._fill()
        if self._queue[-1].kind == _BATCH and len(self._queue) <= AHEAD:
            self._fill()
        item = self._queue.popleft()
        for fn, args in item.notes:
            fn(*args)
        if item.kind == _ERROR:
            raise item.value
        if item.kind == _END:
            raise StopIteration
        consumer = self._rt.current_stream(self._device)
        self._rt.wait(consumer, item.event)
        for t in item.tensors:
            self._rt.record_stream(t, consumer)
        return item.value

    def _fill(self) -> None:
        try:
            host = self._pull()
        except StopIteration:
            self._queue.append(_Item(_END, None, None, (), self._take_notes()))
            return
        except Exception as e:  # the batch's error: raised in its turn
            self._queue.append(_Item(_ERROR, e, None, (), self._take_notes()))
            return
        if self._stream is None:
            self._device = self._rt.device(self._spec)
            self._stream = self._rt.new_stream(self._device)
        tensors = []
        rt, device = self._rt, self._device

        def copy(t):
            d = rt.to_device(t, device)
            tensors.append(d)
            return d

        with rt.use_stream(self._stream):
            out = map_tensors(host, copy)
            event = rt.record(self._stream)
        with self._lock:
            self._reading.append((event, host))
        self._queue.append(_Item(_BATCH, out, event, tensors, self._take_notes()))

    def _take_notes(self) -> list:
        notes, self._notes = self._notes, []
        return notes

    def _retire(self) -> None:
        """Drops the host batches whose copies are done (their slots go back)."""
        with self._lock:
            r = self._reading
            while r and r[0][0].query():
                r.popleft()

    def pending(self) -> bool:
        return bool(self._reading)

    def poll(self) -> None:
        self._retire()

    def finish_copies(self) -> None:
        """Waits for every copy queued (shutdown, a new epoch) and drops the host batches."""
        with self._lock:
            if self._reading:
                self._reading[-1][0].synchronize()
                self._reading.clear()

    def clear(self) -> None:
        """A new epoch or a resume: what was pulled ahead belongs to the old one."""
        self.finish_copies()
        self._queue.clear()
        self._notes.clear()

    def device(self):
        return self._device
