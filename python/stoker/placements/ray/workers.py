"""Ray actors: workers on a Ray cluster's nodes, behind the same ``Workers`` interface.

Each worker is an actor (``_Actor``) that runs the same ``engine.worker.WorkerLoop`` over an
endpoint of its own: a message from the main process is one actor call (``handle``), and what
the loop sends back (a stream's state, skips, errors, the batch) is that call's result. A batch
is laid out by the same C++ encoder into one NumPy buffer (``_stoker.encode_array``), which Ray
stores in its object store; the main process decodes it where it lies (``decode_buffer``): its
tensors are views of the object store's memory on this node (one network transfer when the
actor ran on another node), and the object is released when the last view dies.

- The dataset is put in the object store once per iterator (``ray.put``) and every actor gets a
  reference: each node fetches it once.
- Calls to one actor run one at a time, in the order they were sent (one concurrency group of
  one thread), so its events keep their order; ``status`` and ``stack`` run beside them.
- A dead actor (its process died, its node left the cluster, Ray's memory monitor killed it, the
  iterator killed it for a hang) is one ``WorkerExited``, named, after the results it returned.
- A replacement that finds no room within ``Ray.start_timeout_s`` is a ``WorkerLost``: the
  iterator sends its work to the others; once the cluster has room a new actor starts and
  reports ``WorkerReady``.
- Batches held or in flight are bounded: task calls wait, in the main process, while the bytes of
  live batches exceed the share of ``max_shared_memory``.
- ``shutdown`` kills every actor; actors also die with this process (they belong to its job).

Thread contract (``base.Workers``): the iterating thread calls everything but the read methods
and ``shutdown``, which any thread may call (one lock guards the tables).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import threading
import time
import traceback
import weakref

from .. import _stoker
from .._errors import FallbackRequired
from ..engine import protocol
from ..engine.events import WorkerExited, WorkerLost, WorkerReady, from_message
from ..engine.worker import WorkerLoop
from .base import Hung, Workers

_STATES = ("idle", "loading", "collating", "encoding", "starting")
_STATE_OF = {protocol.STATE_IDLE: "idle", protocol.STATE_FETCHING: "loading",
             protocol.STATE_COLLATING: "collating", protocol.STATE_ENCODING: "encoding",
             protocol.STATE_STARTING: "starting"}
_SLICE_S = 0.05  # waits return to Python this often (Ctrl+C)


def ray_module():
    try:
        import ray
    except ImportError as e:
        raise ImportError(
            "stoker.Ray(...) runs workers as actors on a Ray cluster and needs Ray: "
            "pip install 'stoker[ray]' (or pip install ray)") from e
    return ray


# -- the actor's side ------------------------------------------------------------------------------
class _Endpoint:
    """What a WorkerLoop talks to inside an actor: messages go into the current call's result,
    status is kept here (``snapshot``, read by the main process through ``status``)."""

    def __init__(self):
        self.outbox: list = []
        self._lock = threading.Lock()
        self._state, self._since = "starting", time.monotonic()
        self._task, self._index, self._position = 0, None, None
        self._seconds = dict.fromkeys(_STATES, 0.0)
        self.samples = self.batches = self.bytes_sent = 0
        self.cap = 0  # bytes a batch may take (max_shared_memory's share; 0: no cap)

    def send(self, mtype, task, a=0, payload=b""):
        self.outbox.append((mtype, task, a, bytes(payload)))

    def send_batch(self, task, obj, mode, indices=None) -> bool:
        try:
            buf = _stoker.encode_array(obj, mode, indices)
        except FallbackRequired:
            return False
        self.outbox.append((protocol.MSG_BATCH, task, buf.nbytes, buf))
        with self._lock:
            self.batches += 1
            self.bytes_sent += buf.nbytes
        return True

    def enter(self, state, task, index, position=-1):
        now = time.monotonic()
        with self._lock:
            self._seconds[self._state] = self._seconds.get(self._state, 0.0) + now - self._since
            self._state, self._since = _STATE_OF.get(state, "idle"), now
            self._task, self._index = task, index
            self._position = None if position is None or position < 0 else position

    def add_sample(self):
        with self._lock:
            self.samples += 1

    def update_rss(self):
        pass

    def set_shared_memory_limit(self, cap_bytes, patience_s):
        self.cap = cap_bytes

    def snapshot(self) -> dict:
        import resource

        now = time.monotonic()
        with self._lock:
            seconds = dict(self._seconds)
            seconds[self._state] = seconds.get(self._state, 0.0) + now - self._since
            ru = resource.getrusage(resource.RUSAGE_SELF)
            try:
                with open("/proc/self/statm") as f:
                    rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            except OSError:
                rss = 0
            return {"pid": os.getpid(), "state": self._state, "state_seconds": now - self._since,
                    "task": self._task, "index": self._index, "position": self._position,
                    "samples": self.samples, "batches": self.batches, "rss_bytes": rss,
                    "bytes_sent": self.bytes_sent, "seconds_in": seconds,
                    "cpu_seconds": ru.ru_utime + ru.ru_stime}


class _Actor:
    """One worker on the cluster (made a Ray actor class by ``_actor_class``)."""

    def __init__(self, worker_id, config, dataset):
        self._ep = _Endpoint()
        self._thread = None
        self._loop = WorkerLoop(self._ep, worker_id, dataclasses.replace(config, dataset=dataset))
        self._loop.prepare()  # torch's worker set-up: seeds, worker info, worker_init_fn
        self._ep.enter(protocol.STATE_IDLE, 0, None)

    def ready(self) -> dict:
        import ray

        return {"pid": os.getpid(), "node": ray.util.get_node_ip_address(),
                "node_id": ray.get_runtime_context().get_node_id()}

    def handle(self, mtype, task, fmt, payload):
        self._thread = threading.get_ident()
        self._ep.outbox = []
        self._loop.handle(mtype, task, fmt, payload)
        self._ep.enter(protocol.STATE_IDLE, self._loop.task, None)
        out, self._ep.outbox = self._ep.outbox, []
        return out, self._ep.snapshot()

    def status(self) -> dict:
        return self._ep.snapshot()

    def stack(self) -> str:
        import sys

        frame = sys._current_frames().get(self._thread) if self._thread else None
        lines = traceback.format_stack(frame) if frame is not None else []
        return "Stack (most recent call last):\n" + "".join(lines) if lines else ""


_ACTOR = None


def _actor_class():
    """The actor class: the loop's calls one at a time and in order (group "loop"); status,
    stack and ready beside them (group "look")."""
    global _ACTOR
    if _ACTOR is None:
        ray = ray_module()

        class StokerWorker(_Actor):
            @ray.method(concurrency_group="loop")
            def handle(self, mtype, task, fmt, payload):
                return _Actor.handle(self, mtype, task, fmt, payload)

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


# -- the main process's side ---------------------------------------------------------------------
class _Batch:
    """A batch in the object store (``BatchReady.batch``): views of it, or nothing."""

    def __init__(self, buf, owner):
        self._buf = buf
        self._owner = owner

    def decode(self):
        buf, self._buf = self._buf, None
        batch = _stoker.decode_buffer(buf)
        self._owner._hold(buf)
        return batch

    def discard(self) -> None:
        self._buf = None


class RayWorkers(Workers):
    """Worker ids in `ids` as actors, per `spec` (``config.placement.Ray``)."""

    start_method = "ray"

    def __init__(self, spec, num_workers: int, ids, memory_cap: int | None = None):
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
        self._actors: dict = {}  # worker -> actor handle
        self._calls: dict = {}  # worker -> deque of (ref, kind, task) in the order sent
        self._ready: dict = {}  # worker -> the ready() call of an actor still starting
        self._info: dict = {}  # worker -> {"pid", "node"} once ready
        self._snap: dict = {}  # worker -> the actor's status after its last call
        self._live: dict = {}  # worker -> a status asked for now (capture_stack)
        self._started = dict.fromkeys(range(num_workers), 0.0)
        self._sent = dict.fromkeys(range(num_workers), 0.0)
        self._done_at = dict.fromkeys(range(num_workers), 0.0)  # its last call's result came
        self._configs: dict = {}
        self._hung: dict = {}
        self._leaving: set = set()
        self._lost: dict = {}  # worker -> since when it found no room
        self._back: set = set()  # lost ones started again: WorkerReady when ready
        self._events: collections.deque = collections.deque()
        self._dataset = None  # (the dataset object, its object ref)
        self._cap = memory_cap  # bytes of batches held by the user or in flight
        self._held: dict = {}  # id(buffer) -> bytes, while the user holds views of it
        self._closed = False
        self._config = None  # what a worker started now gets (config_changed)

    # -- life ------------------------------------------------------------------------------------
    def _dataset_ref(self, dataset):
        if self._dataset is None or self._dataset[0] is not dataset:
            self._dataset = (dataset, self._ray.put(dataset))
        return self._dataset[1]

    def start(self, worker_id: int, config) -> None:
        with self._lock:
            if self._closed:  # shut down (another thread): no actor may outlive it
                return
            if self._lost.pop(worker_id, None) is not None:
                self._back.add(worker_id)  # a lost worker started again: WorkerReady once up
        ref = self._dataset_ref(config.dataset)
        actor = _actor_class().options(num_cpus=self._spec.cpus_per_worker,
                                       max_restarts=0).remote(
            worker_id, dataclasses.replace(config, dataset=None), ref)
        with self._lock:
            if self._closed:  # shut down while the actor was being made
                try:
                    self._ray.kill(actor, no_restart=True)
                except Exception:
                    pass
                return
            self._actors[worker_id] = actor
            self._calls[worker_id] = collections.deque()
            self._ready[worker_id] = actor.ready.remote()
            self._configs[worker_id] = config
            self._started[worker_id] = time.monotonic()
            self._done_at[worker_id] = time.monotonic()
            self._leaving.discard(worker_id)
            self._hung.pop(worker_id, None)
            self._snap.pop(worker_id, None)
            self._live.pop(worker_id, None)  # the last actor's status is not this one's

    def _drop(self, worker_id: int) -> None:
        actor = self._actors.pop(worker_id, None)
        self._calls.pop(worker_id, None)
        self._ready.pop(worker_id, None)
        self._info.pop(worker_id, None)
        if actor is not None:
            try:
                self._ray.kill(actor, no_restart=True)
            except Exception:
                pass

    def stop(self, worker_id: int) -> None:
        with self._lock:
            self._leaving.add(worker_id)
            self._drop(worker_id)

    def kill(self, worker_id: int, hung: Hung) -> None:
        with self._lock:
            self._hung[worker_id] = hung
            actor = self._actors.get(worker_id)
        if actor is not None:
            try:
                self._ray.kill(actor, no_restart=True)
            except Exception:
                pass

    def shutdown(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for w in list(self._actors):
                self._drop(w)
            self._events.clear()
            self._dataset = None

    # -- messages --------------------------------------------------------------------------------
    def _call(self, worker_id: int, kind: str, mtype: int, task: int, fmt: int,
              payload: bytes) -> bool:
        with self._lock:
            actor = self._actors.get(worker_id)
            if actor is None or worker_id in self._lost:
                return False
            self._sent[worker_id] = time.monotonic()
            ref = actor.handle.remote(mtype, task, fmt, payload)
            self._calls[worker_id].append((ref, kind, task, self._sent[worker_id]))
        return True

    def send_task(self, worker_id: int, task: int, index) -> bool:
        self._wait_for_room()
        fmt, payload = protocol.encode_index(index)
        return self._call(worker_id, "task", protocol.MSG_TASK, task, fmt, payload)

    def config_changed(self, config) -> None:
        with self._lock:
            self._config = config

    def begin_epoch(self, worker_id: int, epoch: int, payload: bytes) -> bool:
        return self._call(worker_id, "epoch", protocol.MSG_RESUME, epoch, 0, payload)

    def set_memory_share(self, worker_id: int, nbytes) -> bool:
        return True  # the bound is kept here, over all workers (_wait_for_room)

    # -- the bytes of batches ----------------------------------------------------------------------
    def _hold(self, buf) -> None:
        key, n = id(buf), buf.nbytes
        with self._lock:
            self._held[key] = n
        weakref.finalize(buf, self._let_go, key)

    def _let_go(self, key) -> None:
        with self._lock:
            self._held.pop(key, None)

    def _wait_for_room(self) -> None:
        """Back-pressure: while the batches the user holds take the whole cap, new tasks wait
        (a batch comes free when its last view dies)."""
        if not self._cap:
            return
        deadline = time.monotonic() + 30.0
        while sum(self._held.values()) >= self._cap and time.monotonic() < deadline:
            time.sleep(0.01)

    # -- waiting ---------------------------------------------------------------------------------
    def wait(self, timeout_s):
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            if self._events:
                return self._events.popleft()
            self._check_starts()
            if self._events:
                return self._events.popleft()
            with self._lock:
                heads = {q[0][0]: w for w, q in self._calls.items() if q}
                starting = {ref: w for w, ref in self._ready.items()}
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
                    self._started_ok(starting[ref], ref)
                else:
                    self._result(heads[ref], ref)
            if self._events:
                return self._events.popleft()
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def _started_ok(self, w: int, ref) -> None:
        try:
            info = self._ray.get(ref)
        except Exception as e:
            with self._lock:
                self._ready.pop(w, None)
            self._died(w, e)
            return
        with self._lock:
            self._ready.pop(w, None)
            self._info[w] = info
            back = w in self._back
            self._back.discard(w)
        if back:
            self._events.append(WorkerReady(w))

    def _check_starts(self) -> None:
        """Actors that found no room in time are lost (their work goes elsewhere); lost ones are
        started again once the cluster has room."""
        now = time.monotonic()
        limit = self._spec.start_timeout_s
        with self._lock:
            late = [w for w in self._ready if w not in self._lost and w not in self._back
                    and now - self._started[w] > limit]
        if late and self._cluster_holds(len(self._actors) + len(self._lost)):
            late = []  # slow to start (imports, a large dataset to fetch), not short of room
        for w in late:
            with self._lock:
                self._leaving.add(w)
                self._drop(w)
                self._lost[w] = now
            self._events.append(WorkerLost(w, (
                f"a new actor for worker {w} found no room on the cluster for "
                f"{limit:.0f} s ({self._spec.cpus_per_worker:g} CPU asked)")))
        with self._lock:
            lost = [w for w, since in self._lost.items() if now - since > 2.0]
        if lost and self._cluster_holds(len(self._actors) + 1) and self._has_room():
            # the config of now (a later epoch's seeds and state), not the one it started with
            self.start(lost[0], self._config or self._configs[lost[0]])

    def _node_alive(self, node_id: str) -> bool:
        """Whether the node is still in the cluster (Ray notices a lost node within about a
        second; a death seen before that is named by Ray's own words)."""
        deadline = time.monotonic() + 1.0
        while True:
            try:
                alive = {n["NodeID"]: n["Alive"] for n in self._ray.nodes()}
            except Exception:
                return True
            if not alive.get(node_id, False):
                return False
            if time.monotonic() >= deadline:
                return True
            time.sleep(0.2)

    def _has_room(self) -> bool:
        try:
            return self._ray.available_resources().get("CPU", 0.0) >= self._spec.cpus_per_worker
        except Exception:
            return False

    def _cluster_holds(self, actors: int) -> bool:
        """The cluster's live nodes have CPUs for `actors` of ours (an actor still pending past
        its time while they do is slow to start, not short of room; while they do not, it
        cannot start until a node joins)."""
        try:
            total = self._ray.cluster_resources().get("CPU", 0.0)
        except Exception:
            return True
        return total >= actors * self._spec.cpus_per_worker

    def _result(self, w: int, ref) -> None:
        with self._lock:
            q = self._calls.get(w)
            if not q or q[0][0] is not ref:
                return
            _, kind, task, _ = q[0]
        # the call leaves the queue only once its result is in hand: an interrupt (Ctrl+C)
        # during get() leaves it there, to be collected again
        try:
            messages, snap = self._ray.get(ref)
        except Exception as e:  # the actor died (RayActorError), or the call itself failed
            if self._pop_call(w, ref):
                self._died(w, e, task if kind == "task" else None)
            return
        with self._lock:
            if not self._pop_call_locked(w, ref):
                return
            self._snap[w] = snap
            self._live.pop(w, None)  # older than the result just in
            self._done_at[w] = time.monotonic()
        for mtype, t, a, payload in messages:
            batch = _Batch(payload, self) if mtype == protocol.MSG_BATCH else None
            ev = from_message(w, mtype, t, a, payload, batch)
            if ev is not None:
                self._events.append(ev)

    def _pop_call(self, w: int, ref) -> bool:
        with self._lock:
            return self._pop_call_locked(w, ref)

    def _pop_call_locked(self, w: int, ref) -> bool:
        q = self._calls.get(w)
        if not q or q[0][0] is not ref:
            return False
        q.popleft()
        return True

    def _died(self, w: int, error, task=None) -> None:
        with self._lock:
            if w in self._leaving or w not in self._actors:
                self._leaving.discard(w)
                return
            info = self._info.get(w, {})
            snap = self._snap.get(w, {})
            hung = self._hung.pop(w, None)
            self._drop(w)
        if info.get("node_id") and not self._node_alive(info["node_id"]):
            info = dict(info, node_lost=True)
        cause, explanation = _name_death(error, w, info, hung)
        index = hung.index if hung else None
        self._events.append(WorkerExited(
            w, info.get("pid"), 0, None, cause, explanation, index, busy=task is not None,
            hung=hung is not None, started=bool(info) or bool(snap) or hung is not None,
            outside=False, task=task, position=None))

    # -- reading ---------------------------------------------------------------------------------
    def has(self, worker_id: int) -> bool:
        with self._lock:
            return worker_id in self._actors

    def pid(self, worker_id: int):
        with self._lock:
            return self._info.get(worker_id, {}).get("pid")

    def node(self, worker_id: int):
        with self._lock:
            return self._info.get(worker_id, {}).get("node")

    def status(self, worker_id: int):
        """The actor's last status, with what this process knows since: while it has calls
        waiting it is busy with the first of them (since its last result came back)."""
        with self._lock:
            if worker_id not in self._actors:
                return None
            snap = dict(self._live.get(worker_id) or self._snap.get(worker_id) or {})
            q = self._calls.get(worker_id)
            starting = worker_id in self._ready
            # the first call waiting started when it was sent or when the one before it ended
            since = max(self._done_at[worker_id], q[0][3]) if q else None
            now = time.monotonic()
        if starting:
            snap.update(state="starting", state_seconds=now - self._started[worker_id])
        elif q:
            snap.update(state="loading", state_seconds=now - since)
            snap.setdefault("index", None)
        elif snap:
            snap.update(state="idle", state_seconds=now - self._done_at[worker_id])
        else:
            return None
        snap.setdefault("seconds_in", dict.fromkeys(_STATES, 0.0))
        snap.setdefault("rss_bytes", 0)
        snap.setdefault("index", None)
        snap.setdefault("position", None)
        snap.setdefault("task", 0)
        snap.setdefault("samples", 0)
        snap.setdefault("batches", 0)
        snap.setdefault("bytes_sent", 0)
        return snap

    def is_stopped(self, worker_id: int) -> bool:
        return False

    def started_at(self, worker_id: int) -> float:
        return self._started[worker_id]

    def last_sent(self, worker_id: int) -> float:
        return self._sent[worker_id]

    def capture_stack(self, worker_id: int) -> str:
        with self._lock:
            actor = self._actors.get(worker_id)
        if actor is None:
            return ""
        try:
            stack, live = self._ray.get([actor.stack.remote(), actor.status.remote()],
                                        timeout=2.0)
        except Exception:
            return ""
        with self._lock:
            self._live[worker_id] = live
        return stack

    def cpu_seconds(self, worker_id: int) -> float:
        with self._lock:
            return float((self._snap.get(worker_id) or {}).get("cpu_seconds", 0.0))

    def slot_usage(self) -> dict:
        with self._lock:
            held = sum(self._held.values())
            n = len(self._held)
        return {"slots": n, "bytes_mapped": held, "slots_held_by_user": n,
                "bytes_held_by_user": held, "slots_waiting": 0, "bytes_waiting": 0}

    def scale_hint(self) -> str:
        try:
            free = self._ray.available_resources().get("CPU", 0.0)
            nodes = sum(1 for n in self._ray.nodes() if n.get("Alive"))
        except Exception:
            free, nodes = 0.0, 0
        return (f"More workers (num_workers; the cluster has {free:g} CPUs free on {nodes} "
                "node(s)), or more nodes in the cluster (ray start --address ... on another "
                "machine), would help.")

    def stats(self) -> list[dict]:
        out = []
        for w in self._ids:
            st = self.status(w)
            entry = {"id": w, "pid": self.pid(w), "alive": st is not None,
                     "placement": "ray", "node": self.node(w)}
            if w in self._lost:
                entry["lost"] = True
            if st:
                entry.update({
                    "state": st["state"], "index": st["index"], "task": st["task"],
                    "samples": st["samples"], "batches": st["batches"],
                    "rss_bytes": st["rss_bytes"], "bytes_sent": st["bytes_sent"],
                    "seconds": {"getitem": st["seconds_in"].get("loading", 0.0),
                                "collate": st["seconds_in"].get("collating", 0.0),
                                "encode": st["seconds_in"].get("encoding", 0.0),
                                "idle": st["seconds_in"].get("idle", 0.0)}})
            out.append(entry)
        return out




def _name_death(error, w, info, hung):
    """(short cause, explanation) of an actor's death, from Ray's error."""
    where = f"on node {info['node']}" if info.get("node") else "on the cluster"
    text = str(error)
    if hung is not None:
        cause = f"hung for {hung.seconds:.1f} s and was killed (hang_timeout)"
        explanation = f"{cause}."
        if hung.stack:
            explanation += f"\nIts Python stack when it was stopped:\n{hung.stack}"
        return cause, explanation + (
            "\nWhat to do: find what that sample waits on (a network filesystem, a lock); "
            "raise hang_timeout if it is legitimately slow.")
    low = text.lower()
    if info.get("node_lost") or "node has died" in low or "node died" in low:
        cause = f"was lost with its node ({info.get('node', 'a node')} left the cluster)"
        what = ("a node that leaves the cluster (stopped, preempted, out of reach) takes its "
                "actors with it; stoker re-issues their batches")
    elif "memory monitor" in low or "running low on memory" in low \
            or type(error).__name__ == "OutOfMemoryError":
        cause = f"was killed by Ray's memory monitor (out of memory {where})"
        what = ("the node ran out of memory: lower batch_size or prefetch_factor, make samples "
                "smaller, or give the actors more memory")
    else:
        cause = f"died: its process {where} ended unexpectedly"
        what = ("a crash in native code (SIGSEGV in a decoder), the OOM killer or a kill from "
                "outside; Ray's log of the actor (the driver's output, prefixed with its pid) "
                "has its last lines")
    detail = text.strip().splitlines()
    detail = "\n".join(detail[:12])
    return cause, f"(Ray actor {where}) {cause}.\nRay says: {detail}\nWhat to do: {what}."
