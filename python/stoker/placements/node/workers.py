"""``NodeWorkers``: a rank's side of the node's pool, behind the ``Workers`` interface.

The rank's worker ids are *virtual*: ``num_workers`` says how many of its batches may be in
flight (each id takes ``prefetch_factor`` tasks, as a local worker would), and any of the pool's
workers may load any of them. The iterator above schedules, re-issues and restarts exactly as it
does for local processes; this placement turns that into messages to the pool (``wire``'s table)
and the pool's answers into events:

- ``send_task`` sends a ``Task`` with the base seed and epoch it is seeded from
  (``seed="per_sample"``: the pool's workers make the same values as the rank's own would);
- a ``Batch`` arrives with its slot's memfd: its handle (connection.py) maps it privately and
  builds the tensors as views; when the last view dies the pool is told, and the slot goes back
  to its worker once every rank that holds it let go;
- a pool worker's death on one of this rank's tasks comes as a ``Died`` for the virtual worker,
  with the death's names (signal, OOM, the sample); the pool forgets that worker's other tasks,
  and the rank's supervision restarts it (``start``: a new incarnation) and re-issues them;
- the pool's own end (its connection's EOF) is every virtual worker's death, named as such
  (deaths.py); the next ``start`` connects again, starting a new pool when none runs, so every
  sample is still delivered exactly once.

Each incarnation of a virtual worker has a number (``gen``) that travels with its tasks and
comes back with their outcomes: what the pool sends for an incarnation that has died since is
dropped on both sides. ``view`` names a virtual worker by the pool worker that loads (or last
loaded) its work: its own pid, which ``kill``, ``py-spy`` and ``stats()`` then reach.

Thread contract (``base.Workers``): the iterating thread calls everything but the reads
(``view``, ``capture_stack``, ``slot_usage``, ``where``, ``serving``) and ``shutdown``, which any
thread may call. One lock guards the records and the current connection; the connection itself
orders its writes (connection.py). A batch's release runs in whatever thread drops its last view
and only queues the news.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import threading
import time

from ...common import system as _system
from ...common.errors import EngineError
from ...wire import events, protocol
from ...worker import process as _process
from ..base import STARTUP_GRACE_S, Hung, Workers, WorkerView
from . import deaths, hello, rendezvous, wire
from .connection import Connection

_SLICE_S = 0.05  # waits return to Python this often (Ctrl+C)
HELLO_TIMEOUT_S = 60.0  # the pool answers at once; a pool just started imports Python first


@dataclasses.dataclass
class _Virtual:
    """One virtual worker's incarnation."""

    gen: int
    started_at: float
    last_sent: float = 0.0
    last_done: float = 0.0
    sent: dict = dataclasses.field(default_factory=dict)  # task -> when it was sent
    began: dict = dataclasses.field(default_factory=dict)  # task -> when a pool worker took it
    loaders: dict = dataclasses.field(default_factory=dict)  # task -> the pool worker's pid
    last_pid: int | None = None  # the pool worker that loaded its last batch
    batches: int = 0


class NodeWorkers(Workers):
    start_method = "node"
    start_grace_s = 30.0  # the pool may be starting its first workers

    def __init__(self, spec, num_workers: int):
        if _process.started_for_another():
            raise EngineError(
                "stoker: a worker of the node's pool ran a loader of its own: the dataset's "
                "classes live in your script, which each pool worker imports (as spawn's "
                "workers do), and its top level iterates a loader. Put the training code under "
                "`if __name__ == \"__main__\":`, or the dataset's classes in a module.")
        self._spec = spec
        self._pid = os.getpid()
        self.num_workers = num_workers
        self._job = rendezvous.job_name(spec)
        self._lock = threading.RLock()
        self._conn: Connection | None = None
        self._ready: wire.Ready | None = None
        self._joined = False  # the hello was answered on this connection
        self._virtual: dict[int, _Virtual] = {}
        self._gens = [0] * num_workers
        self._events: collections.deque = collections.deque()
        self._seed = (0, 0)
        self._closed = False
        self._pids: tuple = ()  # the pool workers of this dataset now (wire.Pids)
        self._connect()

    def _current(self) -> Connection | None:
        with self._lock:
            return self._conn

    # -- the connection --------------------------------------------------------------------------
    def _connect(self) -> None:
        sock, pid = rendezvous.connect(self._job)
        with self._lock:
            self._conn = Connection(sock, pid)
            self._joined = False

    def _join(self, config) -> None:
        """Sends the dataset and the workers' config; waits for the pool's answer."""
        conn = self._current()
        if conn is None:
            raise ConnectionError("no connection to the node pool")
        message, sealed = hello.make(config, self._spec.workers)
        try:
            if not conn.send(message, [*sealed.fds(), 1, 2]):  # (stdio: hello.py)
                raise ConnectionError("the node pool ended before it took this loader")
        finally:
            sealed.close()
        if not wire.readable(conn.sock, HELLO_TIMEOUT_S):
            # A pool answers at once, unless it cannot read this rank's frames at all: one of
            # stoker 0.2 or earlier (node protocol 2) reads the header as a broken pickle.
            raise EngineError(
                f"stoker: the node pool running for this job ({self._job}) took this loader but "
                f"did not answer in {HELLO_TIMEOUT_S:.0f} s. A pool of an older stoker (node "
                f"protocol 2 or earlier; this rank speaks {wire.VERSION}) cannot read a newer "
                "rank's messages: run every rank of a job with the same stoker; the other pool "
                "(processes named stoker-pool) exits once its last rank has gone, or give this "
                "job a name of its own (placement=stoker.Node(name=...)).")
        try:
            got = wire.recv(conn.sock)
        except wire.VersionMismatch as e:  # (the pool's answer, read no further than its header)
            raise EngineError(e.for_rank(self._job)) from None
        answer = got[0] if got is not None else None
        if got is not None:
            wire.close_all(got[1])
        if isinstance(answer, wire.Refused):
            raise EngineError(f"stoker: the node's worker pool could not take this loader's "
                              f"dataset: {answer.reason}")
        if not isinstance(answer, wire.Ready):
            raise ConnectionError("the node pool ended before it answered")
        with self._lock:
            self._ready, self._pids = answer, answer.pids
            # (the pid the kernel gave for the socket is the pool's first process, which
            # detached)
            conn.pool_pid = answer.pid
            self._joined = True

    def _drop_conn(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
            self._joined = False
        if conn is not None:
            conn.broken = True
            conn.close()

    # -- life ------------------------------------------------------------------------------------
    def start(self, worker_id: int, config) -> None:
        with self._lock:
            if self._closed:
                raise EngineError("stoker: the workers were shut down while one started")
        if config.seeder is not None:
            self._seed = (config.seeder.base_seed, config.seeder.epoch)
        for attempt in range(3):
            try:
                conn = self._current()
                if conn is not None and conn.broken:
                    self._drop_conn()
                if self._current() is None:
                    self._connect()
                if not self._joined:
                    self._join(config)
                break
            except wire.PeerRefused as e:
                raise EngineError(f"stoker: the node pool's name is now held by another "
                                  f"user's process ({e}): this loader cannot go on") from None
            except (ConnectionError, OSError, EOFError):
                # a pool that was ending as this connected: the next one starts anew
                self._drop_conn()
                if attempt == 2:
                    raise
        with self._lock:
            self._gens[worker_id] += 1
            self._virtual[worker_id] = _Virtual(self._gens[worker_id], time.monotonic())

    def stop(self, worker_id: int) -> None:
        with self._lock:
            v = self._virtual.pop(worker_id, None)
            conn = self._conn
        if v is not None and conn is not None:
            conn.send(wire.Forget(worker_id, v.gen))

    def kill(self, worker_id: int, hung: Hung) -> None:
        with self._lock:
            v = self._virtual.get(worker_id)
            conn = self._conn
        if v is not None and conn is not None:
            conn.send(wire.Kill(worker_id, v.gen, hung))

    def shutdown(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._virtual.clear()
            self._events.clear()
            conn, self._conn = self._conn, None
            gens = list(self._gens)
        if conn is None or os.getpid() != self._pid:
            return  # (a process forked from the rank ends nothing of the rank's)
        for w, gen in enumerate(gens):  # the pool drops the work nobody waits for
            conn.send(wire.Forget(w, gen))
        conn.close_when_free()  # (now, or when the last batch the user holds is let go)

    # -- messages --------------------------------------------------------------------------------
    def send_task(self, worker_id: int, task: int, index, serial: bool = False) -> bool:
        fmt, payload = protocol.encode_index(index)
        with self._lock:
            v = self._virtual.get(worker_id)
            conn = self._conn
            if v is None or conn is None:
                return False
            v.last_sent = time.monotonic()
            v.sent[task] = v.last_sent
        return conn.send(wire.Task(worker_id, v.gen, task, fmt, payload, *self._seed, serial))

    def set_memory_share(self, worker_id: int, nbytes) -> bool:
        # The pool's workers have slots of their own, sized for the node (docs/design/node.md).
        with self._lock:
            return worker_id in self._virtual

    def begin_epoch(self, worker_id: int, epoch: int, payload: bytes) -> bool:
        """A persistent worker's new epoch is a new incarnation: task numbers start again at
        0, so what the pool still has of the old epoch (an epoch left early) must not pass for
        the new one's; the pool forgets it."""
        base_seed = protocol.decode_resume(payload)[0]
        with self._lock:
            v = self._virtual.get(worker_id)
            conn = self._conn
            if v is None or conn is None:
                return False
            self._seed = (base_seed, epoch)
            self._gens[worker_id] += 1
            self._virtual[worker_id] = _Virtual(self._gens[worker_id], v.started_at,
                                                last_pid=v.last_pid)
            self._events.append(events.EpochBegun(worker_id, epoch))
        conn.send(wire.Forget(worker_id, v.gen))
        return True

    # -- waiting ---------------------------------------------------------------------------------
    def wait(self, timeout_s):
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            with self._lock:
                if self._events:
                    return self._events.popleft()
                conn = self._conn
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            slice_s = _SLICE_S if left is None else min(_SLICE_S, left)
            if conn is not None and conn.broken:
                # a write found the connection gone before a read did: the pool ended
                self._pool_ended(conn)
                continue
            if conn is None:
                time.sleep(slice_s)
            elif wire.readable(conn.sock, slice_s):
                self._receive(conn)
                continue
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def _receive(self, conn: Connection) -> None:
        try:
            got = wire.recv(conn.sock)
        except OSError:
            got = None
        if got is None:
            self._pool_ended(conn)
            return
        m, fds = got
        if isinstance(m, wire.Batch):
            batch = conn.batch(m.bid, fds[0], m.offset, m.nbytes)
            v = self._current_virtual(conn, m.w, m.gen)
            if v is None:
                batch.discard()
                return
            self._outcome(v, m.task, batches=1, pid=m.pid)
            with self._lock:
                self._events.append(events.BatchReady(m.w, m.task, batch))
            return
        wire.close_all(fds)
        if isinstance(m, wire.Pids):
            with self._lock:
                self._pids = m.pids
            return
        v = self._current_virtual(conn, getattr(m, "w", -1), getattr(m, "gen", -1))
        if v is None:
            return
        if isinstance(m, wire.Began):
            with self._lock:
                if m.task in v.sent:
                    v.began[m.task] = time.monotonic()
                    v.loaders[m.task] = m.pid
            return
        if isinstance(m, wire.Died):
            with self._lock:
                self._virtual.pop(m.w, None)
                self._events.append(m.exited)
            return
        if isinstance(m, wire.Event):
            ev = m.event
            if events.is_outcome(ev):
                self._outcome(v, ev.task)
            with self._lock:
                self._events.append(ev)

    def _current_virtual(self, conn: Connection, w: int, gen: int) -> _Virtual | None:
        with self._lock:
            v = self._virtual.get(w)
            return v if v is not None and v.gen == gen and conn is self._conn else None

    def _outcome(self, v: _Virtual, task: int, batches: int = 0, pid: int = 0) -> None:
        with self._lock:
            v.sent.pop(task, None)
            v.began.pop(task, None)
            v.last_pid = v.loaders.pop(task, None) or pid or v.last_pid
            v.last_done = time.monotonic()
            v.batches += batches

    def _pool_ended(self, conn: Connection) -> None:
        """The pool's connection ended: every virtual worker died with it."""
        pid = conn.pool_pid
        self._drop_conn()
        with self._lock:
            dead = sorted(self._virtual.items())
            self._virtual.clear()
            for w, v in dead:
                self._events.append(deaths.pool_ended(w, pid, busy=bool(v.sent)))

    # -- reading ---------------------------------------------------------------------------------
    def view(self, worker_id: int) -> WorkerView | None:
        with self._lock:
            v = self._virtual.get(worker_id)
            conn = self._conn
            if v is None or conn is None:
                return None
            # Busy while the pool holds a task of it; the time is that of the task a pool
            # worker has been loading longest (one still queued behind other ranks' work is
            # not late: the pool is busy), which is what hang_timeout measures; the pid is that
            # pool worker's (or the last one that loaded for it).
            now = time.monotonic()
            busy = bool(v.sent)
            oldest = min(v.began, key=lambda t: v.began[t]) if v.began else None
            since = v.began[oldest] if oldest is not None else now
            pid = v.loaders.get(oldest) if oldest is not None else v.last_pid
            state = "loading" if busy else "idle"
            if busy and not v.began and now - min(v.sent.values()) > STARTUP_GRACE_S:
                # no pool worker took its work for a minute: the hang watch's "not taking
                # work" applies (named, and killed under hang_timeout)
                state, since = "starting", min(v.sent.values())
            status: dict = {
                "state": state,
                "state_seconds": now - since if busy else now - max(v.last_done, v.started_at),
                "index": None, "position": None, "task": min(v.sent) if busy else None,
                "samples": None, "batches": v.batches, "rss_bytes": None, "bytes_sent": None,
                "seconds_in": {}}
            return WorkerView(pid, v.started_at, v.last_sent, 0.0, False, status)

    def where(self, worker_id: int) -> dict:
        with self._lock:
            conn, ready = self._conn, self._ready
            return {"placement": "node", "pool_pid": conn.pool_pid if conn else None,
                    "pool_workers": ready.workers if ready else None}

    def capture_stack(self, worker_id: int) -> str:
        return ""  # the pool takes its worker's stack itself before it kills it for a hang

    def slot_usage(self) -> dict:
        conn = self._current()
        held = conn.holding() if conn is not None else {}
        n, b = len(held), sum(held.values())
        return {"slots": n, "bytes_mapped": b, "slots_held_by_user": n,
                "bytes_held_by_user": b, "slots_waiting": 0, "bytes_waiting": 0}

    def serving(self) -> dict:
        """The pool: its pid, job, the node's bound on its workers loading at once, the pids of
        this dataset's workers now (as the pool last said), and the ranks attached to its group
        when this iterator joined."""
        with self._lock:
            r, pids = self._ready, self._pids
        if r is None:
            return {}
        return {"pid": r.pid, "job": r.job, "workers": r.workers, "pids": list(pids),
                "clients": r.clients}

    def cpus_per_worker(self) -> int:
        """1 here: the pool gives its workers the node budget's share (``budget.worker_cpus``)
        itself, and every rank's hello must carry the same value (it is part of the group's
        key)."""
        return 1

    def scale_hint(self) -> str:
        with self._lock:
            r = self._ready
        return (f"More workers in the node's pool (it loads at most "
                f"{r.workers if r else '?'} batches at once for {_system.local_ranks()} "
                "rank(s) on this machine: stoker.Node(workers=N)), cheaper samples or a larger "
                "prefetch_factor would help.")
