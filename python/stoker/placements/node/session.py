"""One rank's connection to the pool: its outbox with the thread that writes it, and the thread
that reads it and hands each message to the pool or the connection's group.

- a ``Hello`` goes to the pool (``pool.join``: the connection joins the ``Group`` of its key, or
  is ``Refused`` with the reason);
- ``Task`` / ``Release`` / ``Forget`` / ``Kill`` go to the group. A message whose handling
  fails is answered, never dropped: the virtual worker it concerns dies, named
  (``deaths.message_failed``);
- a frame of another protocol version is answered with a ``Refused`` naming both versions
  (the rank reads the version in its header: wire.py);
- the connection ends when its socket does or the rank's process does (the reader also watches
  the peer's pidfd: a descriptor inherited by a child of the rank cannot hide its death), and
  leaves its group (``pool.leave``).

Thread contract: ``put`` from any thread, any lock held (it only queues); ``write`` is the one
writer of the socket (a rank that pauses reading stalls only its own messages); ``read`` is the
one reader. Neither holds a lock of the pool's.
"""

from __future__ import annotations

import collections
import logging
import os
import select
import socket
import threading
from typing import TYPE_CHECKING

from . import deaths, wire

if TYPE_CHECKING:
    from .group import Group

log = logging.getLogger("stoker")


class Session:
    """One connection. What goes to it waits in its outbox for its own writer thread: the pool
    never writes to a socket under its lock."""

    def __init__(self, cid: int, sock: socket.socket, pid: int):
        self.cid = cid
        self.sock = sock
        self.pid = pid
        self.group: Group | None = None  # the Group it joined (group.py)
        self.outbox: collections.deque = collections.deque()  # (message, its own fd copies)
        self.ready = threading.Condition(threading.Lock())
        self.closed = False
        self.refused_version = False  # (a peer of another version is told once)

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


def read(pool, s: Session) -> None:
    """The connection's reader thread, until it ends; then it leaves the pool."""
    try:
        pidfd = os.pidfd_open(s.pid)
    except OSError:
        pidfd = None
    poller = select.poll()
    poller.register(s.sock, select.POLLIN)
    if pidfd is not None:
        poller.register(pidfd, select.POLLIN)
    try:
        while True:
            ready = dict(poller.poll())
            if pidfd is not None and pidfd in ready:
                return  # the rank's process ended (a child may still hold the socket)
            try:
                got = wire.recv(s.sock)
            except wire.VersionMismatch as e:
                _refuse_version(s, e)
                continue
            except OSError:
                return
            if got is None:
                return
            message, fds = got
            try:
                handle(pool, s, message, fds)
            except Exception as e:
                # Never dropped: the rank waits for an answer. A hello is refused with the
                # reason; anything about a virtual worker ends that worker, named, and the
                # rank re-issues its work under its policy.
                log.exception("stoker node pool: a message from pid %d failed", s.pid)
                wire.close_all(fds)
                if isinstance(message, wire.Hello) or s.group is None:
                    s.put(wire.Refused(f"{type(e).__name__}: {e} "
                                       f"({deaths.where_tracebacks_go()})"), ())
                else:
                    s.group.tell_failed(s.cid, message, e)
            pool.wake()
    finally:
        if pidfd is not None:
            os.close(pidfd)
        pool.leave(s)


def _refuse_version(s: Session, e: wire.VersionMismatch) -> None:
    """A frame of another protocol: the rank reads the version in the answer's header (and
    raises, naming both); a rank too old to read it sees its connection refused."""
    if not s.refused_version:
        s.refused_version = True
        log.warning("stoker node pool: pid %d speaks protocol %s of the node pool, this pool "
                    "%d: refused", s.pid, e.theirs, e.ours)
        s.put(wire.Refused(f"the node pool speaks protocol {e.ours}, this rank {e.theirs}"), ())


def handle(pool, s: Session, m, fds) -> None:
    """One message of connection `s` (its descriptors are closed or kept here)."""
    if isinstance(m, wire.Hello):
        pool.join(s, m, fds)
        return
    wire.close_all(fds)
    g = s.group
    if g is None:
        raise TypeError(f"a {type(m).__name__} before the connection's hello")
    if isinstance(m, wire.Task):
        g.add_task(s.cid, m)
    elif isinstance(m, wire.Release):
        g.release(s.cid, m.bid)
    elif isinstance(m, wire.Forget):
        g.forget(s.cid, m.w, m.gen)
    elif isinstance(m, wire.Kill):
        g.kill(g.kill_targets(s.cid, m.w, m.gen, m.hung))  # (a stack: up to a second)
    else:
        raise TypeError(f"not a message of the node pool: {m!r}")
