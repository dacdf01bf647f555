"""The node's pool: one process per job and user on a machine, serving the workers of every
rank's loaders (``python -m stoker.placements.node.pool JOB``; ranks start it, rendezvous.py).

It detaches as it starts (it is nobody's child: no rank's exit or ``wait`` concerns it), binds
the job's abstract socket (a second pool of the same job finds the name taken and leaves), and
serves connections of its own user only (``wire.check_peer``), one per rank's iterator:

- a ``hello`` brings the dataset's sealed memfd, its key and the workers' config; the
  connection joins the ``Group`` of that key (made for the first one: group.py);
- ``task`` / ``release`` / ``kill`` / ``forget`` go to the group; batches, events and deaths
  come back on the same connection (``send``);
- a connection that ends (its iterator finished, or its process died: the pool also watches
  the peer's pidfd, so a descriptor inherited by a child of the rank cannot hide its death)
  leaves its group: its tasks are dropped and its batches let go.

A group no client has used for ``LINGER_S`` ends its workers; the pool exits when it has no
group and no client (also when nobody connected within ``LINGER_S`` of its start), so nothing
outlives the job: when the last rank ends, normally or killed, the pool and its workers follow.

Threads: the main thread accepts; one thread per connection reads it; one per group waits on its
workers (group.py). All state is under ``Pool.lock``; ``send`` takes a connection's own lock
for the write, so a message is never interleaved with another.
"""

from __future__ import annotations

import collections
import logging
import os
import select
import signal
import socket
import sys
import threading
import time

from ... import _system
from . import wire
from .group import Group

log = logging.getLogger("stoker")

LINGER_S = float(os.environ.get("STOKER_NODE_LINGER_S", "5"))


class _Client:
    """One connection. What goes to it waits in its outbox for its own writer thread: the pool
    never writes to a socket under its lock (a rank that pauses reading, in a validation loop,
    must not stall the others)."""

    def __init__(self, cid: int, sock: socket.socket, pid: int):
        self.cid = cid
        self.sock = sock
        self.pid = pid
        self.group: Group | None = None
        self.rank = None
        self.outbox: collections.deque = collections.deque()  # (message, its own fd copies)
        self.ready = threading.Condition(threading.Lock())
        self.closed = False

    def put(self, message, fds) -> None:
        copies = [os.dup(fd) for fd in fds]  # the writer sends and closes them
        with self.ready:
            if self.closed:
                wire.close_all(copies)
                return
            self.outbox.append((message, copies))
            self.ready.notify()

    def write(self) -> None:
        """The writer thread: sends the outbox in order until the connection is closed."""
        while True:
            with self.ready:
                while not self.outbox and not self.closed:
                    self.ready.wait()
                if not self.outbox:
                    self.sock.close()  # (its reader has ended: close() comes after it)
                    return
                message, fds = self.outbox.popleft()
            try:
                wire.send(self.sock, message, fds)
            except OSError:
                self.shut()  # its reader sees the end and cleans up
            finally:
                wire.close_all(fds)

    def shut(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        with self.ready:
            self.closed = True
            left, self.outbox = list(self.outbox), collections.deque()
            self.ready.notify()
        for _, fds in left:
            wire.close_all(fds)


class Pool:
    def __init__(self, job: str, listener: socket.socket):
        self.job = job
        self.lock = threading.RLock()
        self._listener = listener
        self._clients: dict[int, _Client] = {}
        self._groups: dict[str, Group] = {}
        self._next = 0
        self._idle_since = time.monotonic()

    # -- the main thread -------------------------------------------------------------------------
    def serve(self) -> None:
        self._listener.settimeout(0.25)
        while True:
            try:
                sock, _ = self._listener.accept()
            except socket.timeout:
                if self._expire():
                    return
                continue
            sock.setblocking(True)
            try:
                pid = wire.check_peer(sock, "a process connecting to the node pool")
            except (wire.PeerRefused, OSError) as e:
                log.warning("stoker node pool: refused: %s", e)
                sock.close()
                continue
            with self.lock:
                self._next += 1
                c = _Client(self._next, sock, pid)
                self._clients[c.cid] = c
            threading.Thread(target=self._read, args=(c,), name=f"stoker-node-client-{c.cid}",
                             daemon=True).start()
            threading.Thread(target=c.write, name=f"stoker-node-writer-{c.cid}",
                             daemon=True).start()

    def _expire(self) -> bool:
        """Ends groups idle for LINGER_S; True when the pool itself should end."""
        now = time.monotonic()
        ended = []
        with self.lock:
            for key, g in list(self._groups.items()):
                # (a broken group goes with its last client: a rank restarted by its launcher
                # gets new workers, not that group's verdict)
                if not g.clients and (now - g.idle_since > LINGER_S or g.broken is not None):
                    ended.append(self._groups.pop(key))
            last = not self._clients and now - self._idle_since > LINGER_S
            if self._clients:
                self._idle_since = now
            if last:
                self._listener.close()  # no connection can arrive from here on
                ended += self._groups.values()
                self._groups.clear()
            for g in ended:
                g.close()
        for g in ended:
            # (outside the lock, which the group's thread takes): its workers end, and no
            # thread of ours may be in the engine's C++ when the interpreter exits
            g.end()
        return last

    # -- a connection's thread -------------------------------------------------------------------
    def _read(self, c: _Client) -> None:
        try:
            pidfd = os.pidfd_open(c.pid)
        except OSError:
            pidfd = None
        poller = select.poll()
        poller.register(c.sock, select.POLLIN)
        if pidfd is not None:
            poller.register(pidfd, select.POLLIN)
        try:
            while True:
                ready = dict(poller.poll())
                if pidfd is not None and pidfd in ready:
                    return  # the rank's process ended (a child may still hold the socket)
                try:
                    got = wire.recv(c.sock)
                except OSError:
                    return
                if got is None:
                    return
                message, fds = got
                try:
                    self._handle(c, message, fds)
                except Exception as e:
                    # the rank lives and may hold batches: dropping it would free their slots
                    # under its views; the message is dropped, the connection kept
                    log.exception("stoker node pool: a message from pid %d failed", c.pid)
                    wire.close_all(fds)
                    if message[0] == "hello":  # the rank waits for this answer: say why
                        c.put(("error", f"{type(e).__name__}: {e}"), ())
        finally:
            if pidfd is not None:
                os.close(pidfd)
            self._leave(c)

    def _handle(self, c: _Client, message, fds) -> None:
        op = message[0]
        if op == "hello":
            self._hello(c, message[1], fds)
            return
        wire.close_all(fds)
        with self.lock:
            g = c.group
            if g is None:
                return
            if op == "task":
                g.add_task(c.cid, *message[1:])
            elif op == "release":
                g.release(c.cid, message[1])
            elif op == "forget":
                g.forget(c.cid, message[1], message[2])
            elif op == "kill":
                targets = g.kill_targets(c.cid, *message[1:])
        if op == "kill":
            g.kill(targets)  # (a stack takes up to a second: not under the lock)

    def _hello(self, c: _Client, hello: dict, fds) -> None:
        from ...engine.sealed import Sealed

        with self.lock:
            g = self._groups.get(hello["key"])
            if g is None:
                size = _pool_size(hello["workers"], hello["ranks"])
                config = hello["config"]
                config.num_workers = size
                sealed = Sealed.adopt(fds[0], fds[1:])
                fds.clear()  # the Sealed's now, whatever happens next
                g = Group(self, hello["key"], config, sealed, size)
                self._groups[hello["key"]] = g
            else:
                wire.close_all(fds)
            g.attach(c.cid)
            c.group, c.rank = g, hello.get("rank")
            pids = g.pids()
            ranks = len(g.clients)
        self.send(c.cid, ("ready", {"pid": os.getpid(), "workers": g.size, "pids": pids,
                                    "job": self.job, "clients": ranks}))

    def _leave(self, c: _Client) -> None:
        with self.lock:
            self._clients.pop(c.cid, None)
            if c.group is not None:
                c.group.detach(c.cid)
        c.close()
        c.shut()

    # -- what groups call ------------------------------------------------------------------------
    def send(self, cid: int, message, fds=()) -> bool:
        """Queues a message for client `cid` (its writer sends it; `fds` are copied now);
        False when it is gone (its end is handled by its reader)."""
        c = self._clients.get(cid)
        if c is None:
            return False
        c.put(message, fds)
        return True


def _pool_size(workers, ranks: int) -> int:
    """The pool's workers: as given, or the CPUs this job may use less one per rank's loop."""
    if workers != "auto":
        return int(workers)
    return max(1, _system.usable_cpus() - max(1, int(ranks or 1)))


def _detach() -> None:
    """Forks; the first process exits (its parent, a rank, reaps it at once), the second goes
    on in its own session with nothing of the terminal."""
    if os.fork() > 0:
        os._exit(0)
    os.setsid()
    try:  # the starting rank may be bound to its own cores; the pool serves the node's
        os.sched_setaffinity(0, range(os.cpu_count() or 1))
    except OSError:
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C is for the ranks; they leave, it ends
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def main(argv: list[str]) -> int:
    job = argv[0]
    # Set by rendezvous so that this process skips torch; its workers import stoker as any does.
    os.environ.pop("STOKER_NODE_POOL", None)
    listener = wire.new_socket()
    try:
        listener.bind(wire.address(job))
    except OSError:  # another pool of this job holds the name: the ranks use that one
        return 0
    listener.listen(64)
    _detach()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    Pool(job, listener).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
