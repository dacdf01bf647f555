"""``NodeWorkers``: a rank's side of the node's pool, behind the ``Workers`` interface.

The rank's worker ids are *virtual*: ``num_workers`` says how many of its batches may be in
flight (each id takes ``prefetch_factor`` tasks, as a local worker would), and any of the pool's
workers may load any of them. The iterator above schedules, re-issues and restarts exactly as it
does for local processes; this placement turns that into messages to the pool (wire.py) and the
pool's answers into events:

- ``send_task`` queues the task in the pool with the base seed and epoch it is seeded from
  (``seed="per_sample"``: the pool's workers make the same values as the rank's own would);
- a batch arrives as its slot's memfd; ``decode`` maps it privately (what the user writes into a
  tensor stays in this process, even when other ranks map the same slot) and builds the tensors
  as views of it; when the last view dies, the pool is told, and the slot goes back to its
  worker once every rank that holds it let go;
- a pool worker's death on one of this rank's tasks comes as a ``died`` for the virtual worker,
  with the death's names (signal, OOM, the sample); the pool forgets that worker's other tasks,
  and the rank's supervision restarts it (``start``: a new incarnation) and re-issues them;
- the pool's own end (its connection's EOF) is every virtual worker's death, named as such; the
  next ``start`` connects again, starting a new pool when none runs, so every sample is still
  delivered exactly once.

Each incarnation of a virtual worker has a number (``gen``) that travels with its tasks and
comes back with their outcomes: what the pool sends for an incarnation that has died since is
dropped on both sides.

The connection outlives the iterator while the user holds batches of it (their slots must stay
the pool's until then); it closes when the last one is let go.

Thread contract (``base.Workers``): the iterating thread calls everything but the reads
(``view``, ``capture_stack``, ``slot_usage``, ``where``) and ``shutdown``, which any thread may
call; a batch's release runs in whatever thread drops its last view. One lock guards the
records, and a connection's writes take its own lock.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import mmap
import multiprocessing.spawn
import os
import pickle
import select
import threading
import time
import weakref

from ... import _stoker, _system
from ..._errors import EngineError
from ...engine import events, fdpass, protocol
from ...engine import process as _process
from ...engine.sealed import PerWorker, Sealed
from ..base import STARTUP_GRACE_S, Hung, Workers, WorkerView
from . import rendezvous, wire

_SLICE_S = 0.05  # waits return to Python this often (Ctrl+C)
HELLO_TIMEOUT_S = 60.0  # the pool answers once its workers for a new dataset are started


class _Conn:
    """One connection to the pool: its socket, and the batches this process still holds."""

    def __init__(self, sock, pool_pid: int):
        self.sock = sock
        self.pool_pid = pool_pid
        self._fd = sock.fileno()
        fdpass.track(self._fd)  # a forked worker of another loader closes it: the pool sees
        #                         this process's end, not a child's
        # re-entrant: a batch's release may run in a garbage collection inside a send
        self.lock = threading.RLock()
        self.held: collections.Counter = collections.Counter()  # batch id -> times received
        self.bytes: dict[int, int] = {}  # batch id -> its bytes
        self.closing = False
        self.broken = False

    def send(self, message) -> bool:
        with self.lock:
            if self.broken or self.sock.fileno() < 0:
                return False
            try:
                wire.send(self.sock, message)
            except OSError:
                self.broken = True
                return False
        return True

    def release(self, bid: int) -> None:
        """A batch is let go (any thread, also while the interpreter exits)."""
        try:
            with self.lock:
                self.held[bid] -= 1
                if self.held[bid] <= 0:
                    del self.held[bid]
                    self.bytes.pop(bid, None)
                if not self.broken and self.sock.fileno() >= 0:
                    wire.send(self.sock, ("release", bid))
                last = self.closing and not self.held
            if last:
                self.close()
        except Exception:
            pass

    def close(self) -> None:
        with self.lock:
            fdpass.untrack(self._fd)
            try:
                self.sock.close()
            except OSError:
                pass


class _Batch:
    """A batch in a slot of the pool (``BatchReady.batch``): views of it, or nothing."""

    def __init__(self, conn: _Conn, bid: int, fd: int, offset: int, nbytes: int):
        self._fd = fd
        self._offset = offset
        self._nbytes = nbytes
        self._release = _Once(conn, bid)
        self._finalizer = weakref.finalize(self, _drop, [fd], self._release)

    def decode(self):
        self._finalizer.detach()
        fd, self._fd = self._fd, -1
        try:
            m = mmap.mmap(fd, self._offset + self._nbytes, flags=mmap.MAP_PRIVATE,
                          prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            self._release()
            raise
        finally:
            os.close(fd)
        import numpy as np

        buf = np.frombuffer(m, dtype=np.uint8, count=self._nbytes, offset=self._offset)
        weakref.finalize(buf, self._release)
        return _stoker.decode_buffer(buf)

    def discard(self) -> None:
        self._finalizer()


class _Once:
    def __init__(self, conn: _Conn, bid: int):
        self._conn, self._bid = conn, bid

    def __call__(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.release(self._bid)


def _drop(fds: list, release: _Once) -> None:
    for fd in fds:
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass
    release()


@dataclasses.dataclass
class _Virtual:
    """One virtual worker's incarnation."""

    gen: int
    started_at: float
    last_sent: float = 0.0
    last_done: float = 0.0
    sent: dict = dataclasses.field(default_factory=dict)  # task -> when it was sent
    began: dict = dataclasses.field(default_factory=dict)  # task -> when a pool worker took it
    batches: int = 0


def group_key(config, sealed: Sealed) -> tuple[str, bool]:
    """What decides which ranks share workers: the dataset's, collate_fn's and worker_init_fn's
    pickled bytes (and the files passed beside them), and the options that change a batch; and
    whether the pickle refers to this process's ``__main__`` (its script's classes)."""
    h = hashlib.sha256()
    with mmap.mmap(sealed.fd, sealed.nbytes, prot=mmap.PROT_READ) as m:
        h.update(m)
        uses_main = m.find(b"__main__") >= 0
    for fd in sealed.extra_fds:
        st = os.fstat(fd)
        h.update(f"{st.st_dev}:{st.st_ino}".encode())
    h.update(pickle.dumps((config.kind, config.auto_collation, config.collate_mode,
                           config.drop_last, config.on_error, config.max_retries,
                           config.shared_seed)))
    return h.hexdigest(), uses_main


def _readable(sock, timeout_s: float) -> bool:
    p = select.poll()  # (select() fails for descriptors above 1023)
    p.register(sock, select.POLLIN)
    return bool(p.poll(int(timeout_s * 1000)))


def _preparation(uses_main: bool) -> dict:
    """What spawn would tell a child of this process (its sys.path, directory, start method),
    less its secret (the pool's workers are not this process's children) and, unless the
    dataset's pickle needs a class of this process's script, less the script: a pool worker
    runs a script's top level only when it must, as spawn's workers always do."""
    data = multiprocessing.spawn.get_preparation_data("stoker-node-worker")
    data.pop("authkey", None)
    if not uses_main:
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
    return data


class NodeWorkers(Workers):
    start_method = "node"
    start_grace_s = 30.0  # the pool starts a dataset's workers before it answers

    def __init__(self, spec, num_workers: int):
        if _process.started_for_another():
            raise EngineError(
                "stoker: a worker of the node's pool ran a loader of its own: the dataset's "
                "classes live in your script, which each pool worker imports (as spawn's "
                "workers do), and its top level iterates a loader. Put the training code under "
                "`if __name__ == \"__main__\":`, or the dataset's classes in a module.")
        self._spec = spec
        self.num_workers = num_workers
        self._job = rendezvous.job_name(spec)
        self._lock = threading.RLock()
        self._conn: _Conn | None = None
        self._info: dict = {}
        self._joined = False  # the hello was answered on this connection
        self._virtual: dict[int, _Virtual] = {}
        self._gens = [0] * num_workers
        self._events: collections.deque = collections.deque()
        self._seed = (0, 0)
        self._closed = False
        self._connect()

    # -- the connection --------------------------------------------------------------------------
    def _connect(self) -> None:
        sock, pid = rendezvous.connect(self._job)
        with self._lock:
            self._conn = _Conn(sock, pid)
            self._joined = False

    def _join(self, config) -> None:
        """Sends the dataset and the workers' config; waits for the pool's answer."""
        try:
            sealed = Sealed((config.dataset, config.collate_fn, config.init_fn))
        except PerWorker as e:
            raise EngineError(f"stoker: placement=stoker.Node() needs the dataset pickled once "
                              f"for the node's pool, and it holds {e}") from None
        try:
            key, uses_main = group_key(config, sealed)
            plain = dataclasses.replace(
                config, dataset=None, collate_fn=None, init_fn=None, stream_states={},
                shared_memory_share=None, prepare=_preparation(uses_main))
            hello = {"key": key, "config": plain,
                     "workers": self._spec.workers, "ranks": _system.local_ranks(),
                     "rank": os.environ.get("RANK")}
            conn = self._conn
            with conn.lock:
                wire.send(conn.sock, ("hello", hello), sealed.fds())
        finally:
            sealed.close()
        conn.sock.settimeout(HELLO_TIMEOUT_S)
        try:
            got = wire.recv(conn.sock)
        finally:
            conn.sock.settimeout(None)
        if got is not None and got[0][0] == "error":
            raise EngineError(f"stoker: the node's worker pool could not take this loader's "
                              f"dataset: {got[0][1]}")
        if got is None or got[0][0] != "ready":
            raise ConnectionError("the node pool ended before it answered")
        self._info = got[0][1]
        # (the pid the kernel gave for the socket is the pool's first process, which detached)
        conn.pool_pid = self._info.get("pid", conn.pool_pid)
        self._joined = True

    # -- life ------------------------------------------------------------------------------------
    def start(self, worker_id: int, config) -> None:
        with self._lock:
            if self._closed:
                raise EngineError("stoker: the workers were shut down while one started")
        if config.seeder is not None:
            self._seed = (config.seeder.base_seed, config.seeder.epoch)
        for attempt in range(3):
            try:
                if self._conn is not None and self._conn.broken:
                    self._drop_conn()
                if self._conn is None:
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

    def _drop_conn(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
            self._joined = False
        if conn is not None:
            conn.broken = True
            conn.close()

    def stop(self, worker_id: int) -> None:
        with self._lock:
            v = self._virtual.pop(worker_id, None)
            conn = self._conn
        if v is not None and conn is not None:
            conn.send(("forget", worker_id, v.gen))

    def kill(self, worker_id: int, hung: Hung) -> None:
        with self._lock:
            v = self._virtual.get(worker_id)
            conn = self._conn
        if v is not None and conn is not None:
            conn.send(("kill", worker_id, v.gen, hung))

    def shutdown(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._virtual.clear()
            self._events.clear()
            conn, self._conn = self._conn, None
        if conn is None:
            return
        with conn.lock:
            conn.closing = True
            last = not conn.held
        if last:
            conn.close()  # else when the last batch the user holds is let go
        else:
            for w in range(self.num_workers):  # the pool drops the work nobody waits for
                conn.send(("forget", w, self._gens[w]))

    # -- messages --------------------------------------------------------------------------------
    def send_task(self, worker_id: int, task: int, index, one_at_a_time: bool = False) -> bool:
        fmt, payload = protocol.encode_task(index, one_at_a_time)
        with self._lock:
            v = self._virtual.get(worker_id)
            conn = self._conn
            if v is None or conn is None:
                return False
            v.last_sent = time.monotonic()
            v.sent[task] = v.last_sent
        return conn.send(("task", worker_id, v.gen, task, fmt, payload, *self._seed))

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
            self._virtual[worker_id] = _Virtual(self._gens[worker_id], v.started_at)
            self._events.append(events.EpochBegun(worker_id, epoch))
        conn.send(("forget", worker_id, v.gen))
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
            elif _readable(conn.sock, slice_s):
                self._receive(conn)
                continue
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def _receive(self, conn: _Conn) -> None:
        try:
            got = wire.recv(conn.sock)
        except OSError:
            got = None
        if got is None:
            self._pool_ended(conn)
            return
        message, fds = got
        kind, w, gen = message[0], message[1], message[2]
        with self._lock:
            v = self._virtual.get(w)
            current = v is not None and v.gen == gen and conn is self._conn
        if kind == "batch":
            _, _, _, task, bid, offset, nbytes = message
            with conn.lock:
                conn.held[bid] += 1
                conn.bytes[bid] = nbytes
            batch = _Batch(conn, bid, fds[0], offset, nbytes)
            if not current:
                batch.discard()
                return
            self._outcome(v, task, batches=1)
            with self._lock:
                self._events.append(events.BatchReady(w, task, batch))
            return
        wire.close_all(fds)
        if not current:
            return
        if kind == "began":
            with self._lock:
                if message[3] in v.sent:
                    v.began[message[3]] = time.monotonic()
            return
        if kind == "died":
            ev = message[3]
            with self._lock:
                self._virtual.pop(w, None)
                self._events.append(ev)
            return
        ev = message[3]
        if events.is_outcome(ev):
            self._outcome(v, ev.task)
        with self._lock:
            self._events.append(ev)

    def _outcome(self, v: _Virtual, task: int, batches: int = 0) -> None:
        with self._lock:
            v.sent.pop(task, None)
            v.began.pop(task, None)
            v.last_done = time.monotonic()
            v.batches += batches

    def _pool_ended(self, conn: _Conn) -> None:
        """The pool's connection ended: every virtual worker died with it."""
        pid = conn.pool_pid
        self._drop_conn()
        cause = f"ended with the node's worker pool (pid {pid}), which exited or was killed"
        with self._lock:
            dead = sorted(self._virtual.items())
            self._virtual.clear()
            for w, v in dead:
                self._events.append(events.WorkerExited(
                    w, pid, 0, None, cause,
                    f"worker {w} {cause}: its tasks are re-issued; a new pool starts when the "
                    "loader starts its workers again.", None, bool(v.sent), False, True,
                    False))

    # -- reading ---------------------------------------------------------------------------------
    def view(self, worker_id: int) -> WorkerView | None:
        with self._lock:
            v = self._virtual.get(worker_id)
            conn = self._conn
            if v is None or conn is None:
                return None
            # Busy while the pool holds a task of it; the time is that of the task a pool
            # worker has been loading longest (one still queued behind other ranks' work is
            # not late: the pool is busy), which is what hang_timeout measures.
            now = time.monotonic()
            busy = bool(v.sent)
            since = min(v.began.values()) if v.began else now
            state = "loading" if busy else "idle"
            if busy and not v.began and now - min(v.sent.values()) > STARTUP_GRACE_S:
                # no pool worker took its work for a minute: the hang watch's "not taking
                # work" applies (named, and killed under hang_timeout)
                state, since = "starting", min(v.sent.values())
            status = {"state": state,
                      "state_seconds": now - since if busy else now - max(v.last_done,
                                                                           v.started_at),
                      "index": None, "position": None,
                      "task": min(v.sent) if busy else None, "samples": None,
                      "batches": v.batches, "rss_bytes": None, "bytes_sent": None,
                      "seconds_in": {}}
            return WorkerView(conn.pool_pid, v.started_at, v.last_sent, 0.0, False, status)

    def where(self, worker_id: int) -> dict:
        with self._lock:
            conn = self._conn
            return {"placement": "node", "pool_pid": conn.pool_pid if conn else None,
                    "pool_workers": self._info.get("workers")}

    def capture_stack(self, worker_id: int) -> str:
        return ""  # the pool takes its worker's stack itself before it kills it for a hang

    def slot_usage(self) -> dict:
        with self._lock:
            conn = self._conn
        with conn.lock if conn is not None else threading.Lock():
            held = {bid: conn.bytes.get(bid, 0) * k for bid, k in conn.held.items()} \
                if conn is not None else {}
        n, b = len(held), sum(held.values())
        return {"slots": n, "bytes_mapped": b, "slots_held_by_user": n,
                "bytes_held_by_user": b, "slots_waiting": 0, "bytes_waiting": 0}

    def serving(self) -> dict:
        """The pool as it was when this iterator joined it: its pid, job, workers and their
        pids, and the ranks attached to its group then."""
        with self._lock:
            return dict(self._info)

    def scale_hint(self) -> str:
        return (f"More workers in the node's pool (it has {self._info.get('workers')} for "
                f"{_system.local_ranks()} rank(s) on this machine: stoker.Node(workers=N)), "
                "cheaper samples or a larger prefetch_factor would help.")
