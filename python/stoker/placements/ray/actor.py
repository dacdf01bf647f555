"""What runs on the cluster: one worker as a Ray actor.

An actor holds the same ``worker.loop.WorkerLoop`` as a local worker process, over an endpoint
of its own (``ActorEndpoint``): each message from the main process is one actor call
(``handle``), and what the loop sends back (a stream's state, skips, errors, the batch) is that
call's result. The batch is laid out by the same C++ encoder into one NumPy buffer
(``_stoker.encode_array``), which Ray puts in its object store. The actor keeps its own status
(``snapshot``), which the main process reads with each result and through ``status``.

Thread contract: the loop's calls run one at a time, in order, on one thread of the actor (Ray
concurrency group "loop"); ``status``, ``stack`` and ``ready`` run beside them on another
("look"), so the endpoint's counters are guarded by a lock.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import sys
import threading
import time
import traceback

from ... import _stoker
from ...common import system as _system
from ...common.errors import FallbackRequired
from ...wire import protocol
from ...worker.loop import WorkerLoop

# The names of the worker's states, by their number (the C++ status page's: one source).
_STATES = _stoker.WORKER_STATES


def ray_module():
    try:
        import ray
    except ImportError as e:
        raise ImportError(
            "stoker.Ray(...) runs workers as actors on a Ray cluster and needs Ray: "
            "pip install 'stoker[ray]' (or pip install ray)") from e
    return ray


class ActorEndpoint:
    """What a WorkerLoop talks to inside an actor (an ``worker.endpoint.Endpoint``; the actor's
    calls hand it its messages, so it has no ``receive``): messages go into the current call's
    result (``outbox``), the status is kept here (``snapshot``). The main process bounds the bytes of
    the batches it holds (``room.Room``), so ``set_shared_memory_limit`` has nothing to do
    here."""

    def __init__(self):
        self.outbox: list = []
        self._lock = threading.Lock()
        self._state, self._since = "starting", time.monotonic()
        self._task, self._index, self._position = 0, None, None
        self._seconds = dict.fromkeys(_STATES, 0.0)
        self._samples = self._batches = self._bytes_sent = self._in_flight = 0
        self._ready = (0.0, 0.0)  # (CPU, run-queue) seconds spent starting: not reported

    def send(self, mtype, task, a=0, payload=b""):
        self.outbox.append((mtype, task, a, bytes(payload)))

    def send_batch(self, task, obj, mode, indices=None) -> bool:
        try:
            buf = _stoker.encode_array(obj, mode, indices)
        except FallbackRequired:
            return False
        self.outbox.append((protocol.MSG_BATCH, task, buf.nbytes, buf))
        with self._lock:
            self._batches += 1
            self._bytes_sent += buf.nbytes
        return True

    def enter(self, state, task, index, position=-1):
        now = time.monotonic()
        with self._lock:
            self._seconds[self._state] += now - self._since
            self._state, self._since = _STATES[state], now
            self._task, self._index = task, index
            self._position = None if position is None or position < 0 else position

    def add_sample(self):
        with self._lock:
            self._samples += 1

    def set_in_flight(self, n):
        with self._lock:
            self._in_flight = n

    def mark_ready(self, cpu_s, runqueue_s):
        with self._lock:
            self._ready = (cpu_s, runqueue_s)

    def update_rss(self):
        """The resident size is read with each snapshot instead."""

    def set_shared_memory_limit(self, cap_bytes, patience_s):
        """The cap is kept by the main process, over the batches it holds (``room.Room``)."""

    def snapshot(self) -> dict:
        """The actor's status now, in the shape of a local worker's status page."""
        now = time.monotonic()
        ru = resource.getrusage(resource.RUSAGE_SELF)
        runqueue = _system.runqueue_seconds()
        with self._lock:
            if runqueue is not None:  # (since it was ready, as its CPU seconds)
                runqueue = max(0.0, runqueue - self._ready[1])
            seconds = dict(self._seconds)
            seconds[self._state] += now - self._since
            return {"pid": os.getpid(), "state": self._state, "state_seconds": now - self._since,
                    "task": self._task, "index": self._index, "position": self._position,
                    "samples": self._samples, "batches": self._batches,
                    "in_flight": self._in_flight,
                    "rss_bytes": _system.resident_bytes(), "bytes_sent": self._bytes_sent,
                    "seconds_in": seconds,
                    "cpu_seconds": max(0.0, ru.ru_utime + ru.ru_stime - self._ready[0]),
                    "runqueue_seconds": runqueue}


class _Actor:
    """One worker on the cluster (made a Ray actor class by ``actor_class``)."""

    def __init__(self, worker_id, config, dataset):
        self._ep = ActorEndpoint()
        self._thread = None
        self._loop = WorkerLoop(self._ep, worker_id, dataclasses.replace(config, dataset=dataset))
        self._loop.prepare()  # torch's worker set-up: seeds, worker info, worker_init_fn
        self._ep.enter(protocol.STATE_IDLE, 0, None)
        self._ep.mark_ready(*_system.spent_so_far())

    def ready(self) -> dict:
        import ray

        return {"pid": os.getpid(), "node": ray.util.get_node_ip_address(),
                "node_id": ray.get_runtime_context().get_node_id()}

    def handle(self, mtype, task, a, b, payload):
        self._thread = threading.get_ident()
        self._ep.outbox = []
        self._loop.handle(mtype, task, a, b, payload)
        self._ep.enter(protocol.STATE_IDLE, self._loop.task, None)
        out, self._ep.outbox = self._ep.outbox, []
        return out, self._ep.snapshot()

    def status(self) -> dict:
        return self._ep.snapshot()

    def stack(self) -> str:
        frame = sys._current_frames().get(self._thread) if self._thread else None
        lines = traceback.format_stack(frame) if frame is not None else []
        return "Stack (most recent call last):\n" + "".join(lines) if lines else ""


_ACTOR = None


def actor_class():
    """The actor class: the loop's calls one at a time and in order (group "loop"); status,
    stack and ready beside them (group "look")."""
    global _ACTOR
    if _ACTOR is None:
        ray = ray_module()

        class StokerWorker(_Actor):
            @ray.method(concurrency_group="loop")
            def handle(self, mtype, task, a, b, payload):
                return _Actor.handle(self, mtype, task, a, b, payload)

            @ray.method(concurrency_group="look")
            def ready(self):
                return _Actor.ready(self)

            @ray.method(concurrency_group="look")
            def status(self):
                return _Actor.status(self)

            @ray.method(concurrency_group="look")
            def stack(self):
                return _Actor.stack(self)

        _ACTOR = ray.remote(concurrency_groups={"loop": 1, "look": 1})(StokerWorker)
    return _ACTOR
