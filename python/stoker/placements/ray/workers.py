"""``RayWorkers``: worker ids as Ray actors, behind the ``Workers`` interface.

The main process's side of the Ray placement (the package's docstring has the whole picture):
each worker id running an actor has one ``ActorRecord``; each message is one actor call, kept in
the record's queue until its result is in hand, so a worker's events keep their order and a
death is reported after every result it returned. Tasks the worker's memory share has no room
for wait in the record (``room.Room``); a replacement that finds no room on the cluster is lost
(``WorkerLost``) until the cluster has room again (``room.Cluster``).

Thread contract (``base.Workers``): the iterating thread calls everything but the reads
(``view``, ``capture_stack``, ``slot_usage``, ``stats``, ``where``) and ``shutdown``, which
any thread may call; one lock guards the records.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time

from ...wire import protocol
from ...wire.buffer_batch import BufferBatch
from ...wire.events import TaskFailed, WorkerExited, WorkerLost, WorkerReady, from_message
from ..base import Hung, Workers, WorkerView
from .actor import actor_class, ray_module
from .deaths import name_death, start_failed
from .record import ActorRecord, Call, Waiting
from .room import Cluster, Room

_SLICE_S = 0.05  # waits return to Python this often (Ctrl+C)
_RETRY_LOST_S = 2.0  # a lost worker is tried again this long after it was found without room


def _batch(buf, room: Room, worker_id: int) -> BufferBatch:
    """A batch in the object store (``BatchReady.batch``): its views count against the worker's
    room while the user holds them."""
    return BufferBatch(lambda: buf, on_view=lambda b: room.hold(worker_id, b))


class RayWorkers(Workers):
    """Worker ids in `ids` as actors, per `spec` (``config.placement.Ray``)."""

    start_method = "ray"

    def __init__(self, spec, num_workers: int, ids):
        # an actor imports torch and unpickles the dataset before it answers: seconds
        self.start_grace_s = spec.start_timeout_s
        ray = ray_module()
        if not ray.is_initialized():
            ray.init(address=spec.address, ignore_reinit_error=True,
                     log_to_driver=True, logging_level="warning")
        self._ray = ray
        self._spec = spec
        self.num_workers = num_workers
        self._ids = list(ids)
        self._lock = threading.RLock()
        self._actors: dict[int, ActorRecord] = {}  # running: started, end not yet seen
        self._lost: dict[int, tuple[float, object]] = {}  # found no room: (since, its config)
        self._events: collections.deque = collections.deque()
        self._dataset = None  # (the dataset object, its object ref)
        self._room = Room()
        self._cluster = Cluster(ray, spec.cpus_per_worker)
        self._closed = False
        self._config = None  # what a worker started now gets (config_changed)

    @property
    def ids(self):
        return self._ids

    # -- life ------------------------------------------------------------------------------------
    def _dataset_ref(self, dataset):
        if self._dataset is None or self._dataset[0] is not dataset:
            self._dataset = (dataset, self._ray.put(dataset))
        return self._dataset[1]

    def start(self, worker_id: int, config) -> None:
        with self._lock:
            if self._closed:  # shut down (another thread): no actor may outlive it
                return
            back = self._lost.pop(worker_id, None) is not None  # WorkerReady once it is up
        ref = self._dataset_ref(config.dataset)
        handle = actor_class().options(num_cpus=self._spec.cpus_per_worker,
                                       max_restarts=0).remote(
            worker_id, dataclasses.replace(config, dataset=None), ref)
        with self._lock:
            if self._closed:  # shut down while the actor was being made
                self._kill(handle)
                return
            self._actors[worker_id] = ActorRecord(handle, config, ready=handle.ready.remote(),
                                                  back=back)
        self._room.set_share(worker_id, config.shared_memory_share)

    def _kill(self, handle) -> None:
        try:
            self._ray.kill(handle, no_restart=True)
        except Exception:
            pass

    def stop(self, worker_id: int) -> None:
        with self._lock:
            rec = self._actors.pop(worker_id, None)
            self._lost.pop(worker_id, None)
        if rec is not None:
            self._kill(rec.handle)

    def kill(self, worker_id: int, hung: Hung) -> None:
        with self._lock:
            rec = self._actors.get(worker_id)
            if rec is not None:
                rec.hung = hung
        if rec is not None:
            self._kill(rec.handle)

    def shutdown(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            records = list(self._actors.values())
            self._actors.clear()
            self._lost.clear()
            self._events.clear()
            self._dataset = None
        for rec in records:
            self._kill(rec.handle)

    # -- messages --------------------------------------------------------------------------------
    def _call_locked(self, rec: ActorRecord, kind: str, mtype: int, task: int, fmt: int,
                     payload: bytes, serial: bool = False) -> None:
        rec.last_sent = time.monotonic()
        ref = rec.handle.handle.remote(mtype, task, fmt, int(serial), payload)
        rec.calls.append(Call(ref, kind, task, rec.last_sent))

    def send_task(self, worker_id: int, task: int, index, serial: bool = False) -> bool:
        fmt, payload = protocol.encode_index(index)
        with self._lock:
            rec = self._actors.get(worker_id)
            if rec is None:
                return False
            if rec.waiting or not self._room.fits(worker_id):  # its batches fill its share
                rec.waiting.append(Waiting(task, fmt, payload, serial, time.monotonic()))
            else:
                self._call_locked(rec, "task", protocol.MSG_TASK, task, fmt, payload, serial)
        return True

    def begin_epoch(self, worker_id: int, epoch: int, payload: bytes) -> bool:
        with self._lock:
            rec = self._actors.get(worker_id)
            if rec is None:
                return False
            rec.waiting.clear()  # the old epoch's tasks: nobody waits for them now
            self._call_locked(rec, "epoch", protocol.MSG_RESUME, epoch, 0, payload)
        return True

    def set_memory_share(self, worker_id: int, nbytes) -> bool:
        with self._lock:
            if worker_id not in self._actors:
                return False
        self._room.set_share(worker_id, nbytes)
        return True

    def config_changed(self, config) -> None:
        with self._lock:
            self._config = config

    def _release_waiting(self) -> None:
        """Sends the tasks held back that now fit; fails the one that waited its patience."""
        now = time.monotonic()
        with self._lock:
            for w, rec in self._actors.items():
                while rec.waiting and self._room.fits(w):
                    t = rec.waiting.popleft()
                    self._call_locked(rec, "task", protocol.MSG_TASK, t.task, t.fmt, t.payload,
                                      t.serial)
                if rec.waiting and self._room.expired(w, rec.waiting[0].since, now):
                    t = rec.waiting.popleft()
                    self._events.append(TaskFailed(w, t.task, self._room.limit_report(w)))

    # -- waiting ---------------------------------------------------------------------------------
    def wait(self, timeout_s):
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            if not self._events:
                self._check_starts()
                self._release_waiting()
            if self._events:
                return self._events.popleft()
            with self._lock:
                heads = {rec.calls[0].ref: (w, rec) for w, rec in self._actors.items()
                         if rec.calls}
                starting = {rec.ready: (w, rec) for w, rec in self._actors.items()
                            if rec.ready is not None}
            refs = list(heads) + list(starting)
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            slice_s = _SLICE_S if left is None else min(_SLICE_S, left)
            if refs:
                # every result already in, not only the first: one left uncollected would look
                # like a worker still loading since it was sent (hang_timeout would kill it)
                done, _ = self._ray.wait(refs, num_returns=len(refs), timeout=0,
                                         fetch_local=True)
                if not done:
                    done, _ = self._ray.wait(refs, num_returns=1, timeout=slice_s,
                                             fetch_local=True)
            else:
                time.sleep(slice_s)
                done = []
            for ref in done:
                if ref in starting:
                    self._started_ok(*starting[ref], ref)
                else:
                    self._result(*heads[ref], ref)
            if self._events:
                return self._events.popleft()
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def _started_ok(self, w: int, rec: ActorRecord, ref) -> None:
        try:
            info = self._ray.get(ref)
        except Exception as e:
            with self._lock:
                rec.ready = None
            self._died(w, rec, e)
            return
        with self._lock:
            rec.ready = None
            rec.info = info
            back, rec.back = rec.back, False
        if back:
            self._events.append(WorkerReady(w))

    def _check_starts(self) -> None:
        """Actors that found no room in time are lost (their work goes elsewhere); lost ones are
        started again once the cluster has room."""
        now = time.monotonic()
        limit = self._spec.start_timeout_s
        with self._lock:
            late = [w for w, rec in self._actors.items() if rec.ready is not None
                    and not rec.back and now - rec.started_at > limit]
            wanted = len(self._actors) + len(self._lost)
        if late and self._cluster.holds(wanted):
            late = []  # slow to start (imports, a large dataset to fetch), not short of room
        for w in late:
            with self._lock:
                rec = self._actors.pop(w, None)
                if rec is None:
                    continue
                self._lost[w] = (now, rec.config)
            self._kill(rec.handle)
            self._events.append(WorkerLost(w, (
                f"a new actor for worker {w} found no room on the cluster for "
                f"{limit:.0f} s ({self._spec.cpus_per_worker:g} CPU asked)")))
        with self._lock:
            lost = [w for w, (since, _) in self._lost.items() if now - since > _RETRY_LOST_S]
            running = len(self._actors)
        if lost and self._cluster.holds(running + 1) and self._cluster.has_room():
            with self._lock:
                config = self._config or self._lost[lost[0]][1]
            # the config of now (a later epoch's seeds and state), not the one it started with
            self.start(lost[0], config)

    def _result(self, w: int, rec: ActorRecord, ref) -> None:
        with self._lock:
            if self._actors.get(w) is not rec or not rec.calls or rec.calls[0].ref is not ref:
                return
            call = rec.calls[0]
        # the call leaves the queue only once its result is in hand: an interrupt (Ctrl+C)
        # during get() leaves it there, to be collected again
        try:
            messages, snap = self._ray.get(ref)
        except Exception as e:  # the actor died (RayActorError), or the call itself failed
            if self._pop_call(rec, ref):
                self._died(w, rec, e, call.task if call.kind == "task" else None)
            return
        with self._lock:
            if not self._pop_call(rec, ref):
                return
            rec.snap = snap
            rec.live = None  # older than the result just in
            rec.done_at = time.monotonic()
        for mtype, t, a, payload in messages:
            batch = _batch(payload, self._room, w) if mtype == protocol.MSG_BATCH else None
            ev = from_message(w, mtype, t, a, payload, batch)
            if ev is not None:
                self._events.append(ev)

    def _pop_call(self, rec: ActorRecord, ref) -> bool:
        with self._lock:
            if not rec.calls or rec.calls[0].ref is not ref:
                return False
            rec.calls.popleft()
            return True

    def _died(self, w: int, rec: ActorRecord, error, task=None) -> None:
        with self._lock:
            if self._actors.get(w) is not rec:  # stopped, or started again meanwhile
                return
            del self._actors[w]
            info, snap, hung = dict(rec.info), rec.snap, rec.hung
        self._kill(rec.handle)
        if info.get("node_id") and not self._cluster.node_alive(info["node_id"]):
            info["node_lost"] = True
        cause, explanation = name_death(error, info, hung)
        self._events.append(WorkerExited(
            worker=w, pid=info.get("pid"), signum=0, exit_code=None, cause=cause,
            explanation=explanation, index=hung.index if hung else None,
            busy=task is not None, hung=hung is not None,
            started=bool(info) or bool(snap) or hung is not None, outside=False, task=task,
            position=None, start_failed=start_failed(error)))

    # -- reading ---------------------------------------------------------------------------------
    def view(self, worker_id: int) -> WorkerView | None:
        with self._lock:
            rec = self._actors.get(worker_id)
            if rec is None:
                return None
            snap = rec.snap or {}
            return WorkerView(rec.info.get("pid"), rec.started_at, rec.last_sent,
                              float(snap.get("cpu_seconds", 0.0)), False,
                              rec.status(time.monotonic()), snap.get("runqueue_seconds"))

    def where(self, worker_id: int) -> dict:
        with self._lock:
            rec = self._actors.get(worker_id)
            out = {"placement": "ray", "node": rec.info.get("node") if rec else None}
            if worker_id in self._lost:
                out["lost"] = True
        return out

    def capture_stack(self, worker_id: int) -> str:
        with self._lock:
            rec = self._actors.get(worker_id)
        if rec is None:
            return ""
        try:
            stack, live = self._ray.get([rec.handle.stack.remote(), rec.handle.status.remote()],
                                        timeout=2.0)
        except Exception:
            return ""
        with self._lock:
            rec.live = live
        return stack

    def slot_usage(self) -> dict:
        return self._room.usage()

    def scale_hint(self) -> str:
        return self._cluster.scale_hint()

    def cpus_per_worker(self) -> int:
        """What each actor asked of the cluster (``Ray(cpus_per_worker=...)``), whole."""
        return max(1, int(self._spec.cpus_per_worker))
