"""Room for Ray workers: the bytes of batches each worker's share of ``max_shared_memory``
allows (``Room``), and the CPUs the cluster has for actors (``Cluster``).

- ``Room``: a batch's buffer lives in this node's object store while the user holds views of it
  (or it waits in the reorder buffer). Each worker has a share of ``max_shared_memory`` (the
  iterator divides the cap among all the workers running, local and remote alike, so a mixed
  loader splits it), as a local worker's slots have. While the bytes a worker's batches hold
  reach its share, its next task is held back in this process; a task held back for
  ``worker.loop.SHARED_MEMORY_PATIENCE_S`` without a batch of that worker coming free fails with
  ``SharedMemoryLimitError`` (``expired``), which says what the user holds — the same wait and
  the same error as a local worker waiting for a slot.
- ``Cluster``: Ray keeps an actor that does not fit pending forever, so the placement asks here
  whether the cluster's live nodes have CPUs for its actors (a replacement pending past its time
  while they do not is lost, not slow), whether a node is still alive, and what is free.

Thread contract: ``Room`` is safe from any thread (one lock; a buffer's release runs in whatever
thread drops its last view). ``Cluster`` asks Ray and keeps nothing: any thread.
"""

from __future__ import annotations

import threading
import time
import weakref

from ...common.errors import SharedMemoryLimitError
from ...common.system import human_bytes
from ...wire import protocol
from ...worker import loop as _worker


class Room:
    def __init__(self, patience_s: float | None = None):
        """`patience_s`: how long a task may wait for room (default: a local worker's,
        ``worker.loop.SHARED_MEMORY_PATIENCE_S``, as it is when the room is made)."""
        self.patience_s = _worker.SHARED_MEMORY_PATIENCE_S if patience_s is None else patience_s
        self._lock = threading.Lock()
        self._held: dict[int, tuple[int, int]] = {}  # id(buffer) -> (worker, bytes)
        self._share: dict[int, int | None] = {}  # worker -> its share (None: no cap)
        self._freed_at: dict[int, float] = {}  # worker -> when a batch of it last came free

    def set_share(self, worker_id: int, nbytes: int | None) -> None:
        with self._lock:
            self._share[worker_id] = nbytes or None

    def hold(self, worker_id: int, buf) -> None:
        """`buf` (a batch of `worker_id`) is in use until it is garbage-collected."""
        key = id(buf)
        with self._lock:
            self._held[key] = (worker_id, buf.nbytes)
        weakref.finalize(buf, self._let_go, key)

    def _let_go(self, key: int) -> None:
        with self._lock:
            held = self._held.pop(key, None)
            if held is not None:
                self._freed_at[held[0]] = time.monotonic()

    def _held_by(self, worker_id: int) -> tuple[int, int]:
        batches = nbytes = 0
        for w, n in self._held.values():
            if w == worker_id:
                batches += 1
                nbytes += n
        return batches, nbytes

    def fits(self, worker_id: int) -> bool:
        """The worker's batches leave room for one more task's."""
        with self._lock:
            share = self._share.get(worker_id)
            return share is None or self._held_by(worker_id)[1] < share

    def expired(self, worker_id: int, since: float, now: float) -> bool:
        """A task of the worker held back since `since` has waited its patience, counted afresh
        from each batch of that worker that came free."""
        with self._lock:
            start = max(since, self._freed_at.get(worker_id, 0.0))
        return now - start > self.patience_s

    def limit_report(self, worker_id: int) -> dict:
        """The ``TaskFailed`` report of a task that found no room: what the worker's share is
        and what its batches hold (the iterator adds what the user holds in all)."""
        with self._lock:
            share = self._share.get(worker_id)
            batches, nbytes = self._held_by(worker_id)
        err = SharedMemoryLimitError(
            f"worker {worker_id} (a Ray actor) waited {self.patience_s:.0f} s for room for its "
            f"next batch: its share of max_shared_memory is {human_bytes(share)} and its "
            f"{batches} batch(es) still held by your code take {human_bytes(nbytes)} of it.")
        return protocol.decode_error(protocol.encode_error(err, worker_id, None))

    def usage(self) -> dict:
        """``Workers.slot_usage``'s figures for the batches held."""
        with self._lock:
            n = len(self._held)
            held = sum(b for _, b in self._held.values())
        return {"slots": n, "bytes_mapped": held, "slots_held_by_user": n,
                "bytes_held_by_user": held, "slots_waiting": 0, "bytes_waiting": 0}


class Cluster:
    """The cluster's CPUs, as Ray reports them, for actors of `cpus_per_worker` CPUs."""

    def __init__(self, ray, cpus_per_worker: float):
        self._ray = ray
        self.cpus_per_worker = cpus_per_worker

    def holds(self, actors: int) -> bool:
        """The cluster's live nodes have CPUs for `actors` actors (an actor still pending past
        its time while they do is slow to start, not short of room; while they do not, it
        cannot start until a node joins)."""
        try:
            total = self._ray.cluster_resources().get("CPU", 0.0)
        except Exception:
            return True
        return total >= actors * self.cpus_per_worker

    def has_room(self) -> bool:
        """One more actor fits in the CPUs free now."""
        try:
            return self._ray.available_resources().get("CPU", 0.0) >= self.cpus_per_worker
        except Exception:
            return False

    def node_alive(self, node_id: str) -> bool:
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

    def scale_hint(self) -> str:
        try:
            free = self._ray.available_resources().get("CPU", 0.0)
            nodes = sum(1 for n in self._ray.nodes() if n.get("Alive"))
        except Exception:
            free, nodes = 0.0, 0
        return (f"More workers (num_workers; the cluster has {free:g} CPUs free on {nodes} "
                "node(s)), or more nodes in the cluster (ray start --address ... on another "
                "machine), would help.")
