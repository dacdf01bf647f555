"""A rank's connection to the node's pool: its socket, the batches of the pool this process
holds, and the sender that tells the pool when the user let go of one.

A batch arrives as its slot's memfd; ``batch()`` makes its handle (``BufferBatch``): ``decode``
maps the memfd privately (what the user writes into a tensor stays in this process, even when
other ranks map the same slot) and builds the tensors as views of it. When the last view dies,
in whatever thread and whatever it was doing (a garbage collection inside a send, say), the news
is only queued, under a re-entrant lock nobody holds while waiting on anything else; the
connection's release thread writes ``Release`` to the socket. So no finalizer ever writes to the
socket or waits for a lock its own thread might hold.

The connection outlives its iterator while the user holds batches of it (their slots must stay
the pool's until then): ``close_when_free`` closes it once the last one is let go.

Thread contract: ``send`` from any thread (one lock orders the writes); ``received`` by the
thread that reads the socket (the iterating thread); a handle's release from any thread;
``close`` and ``close_when_free`` from any thread.
"""

from __future__ import annotations

import collections
import mmap
import os
import threading

from ...wire import fdpass
from ...wire.buffer_batch import BufferBatch
from . import wire


class Connection:
    def __init__(self, sock, pool_pid: int):
        self.sock = sock
        self.pool_pid = pool_pid
        self._owner = os.getpid()  # a process forked from it (a helper) writes nothing here
        self._fd = sock.fileno()
        self._lock = threading.Lock()  # the socket's writes, and `held`
        self._held: collections.Counter = collections.Counter()  # batch id -> views received
        self._bytes: dict[int, int] = {}  # batch id -> its bytes
        self._released: collections.deque = collections.deque()  # let go, not yet told
        # (re-entrant: a view may die in a collection inside the sender's own wait)
        self._news = threading.Condition(threading.RLock())
        # a forked worker of another loader closes it: the pool sees this process's end, not a
        # child's
        fdpass.track(self._fd)
        self._sender: threading.Thread | None = None
        self.closing = False
        self.broken = False
        self.closed = False

    # -- writing ---------------------------------------------------------------------------------
    def send(self, message, fds=()) -> bool:
        """False when the connection is gone (broken, or closed here)."""
        with self._lock:
            if self.broken or self.closed or os.getpid() != self._owner:
                return False
            try:
                wire.send(self.sock, message, fds)
            except OSError:
                self.broken = True
                return False
        return True

    # -- batches ---------------------------------------------------------------------------------
    def batch(self, bid: int, fd: int, offset: int, nbytes: int) -> BufferBatch:
        """The handle of batch `bid` of the pool, `nbytes` at `offset` of memfd `fd` (now the
        handle's)."""
        with self._lock:
            self._held[bid] += 1
            self._bytes[bid] = nbytes
        self._start_sender()
        fds = [fd]

        def open_buffer():
            fd = fds.pop()
            try:
                m = mmap.mmap(fd, offset + nbytes, flags=mmap.MAP_PRIVATE,
                              prot=mmap.PROT_READ | mmap.PROT_WRITE)
            finally:
                os.close(fd)
            import numpy as np

            return np.frombuffer(m, dtype=np.uint8, count=nbytes, offset=offset)

        def drop():
            for fd in fds:
                os.close(fd)
            fds.clear()

        return BufferBatch(open_buffer, release=lambda: self._let_go(bid), drop=drop)

    def _let_go(self, bid: int) -> None:
        """Any thread, a finalizer's included: queues the news for the sender."""
        if os.getpid() != self._owner:
            return  # (a forked helper's copy of a view: the rank's own still holds the slot)
        with self._news:
            self._released.append(bid)
            self._news.notify()

    def holding(self) -> dict:
        """Batch id -> the bytes this process holds of it (views received, not let go)."""
        with self._lock:
            return {bid: self._bytes.get(bid, 0) * k for bid, k in self._held.items()}

    # -- the release thread ------------------------------------------------------------------------
    def _start_sender(self) -> None:
        with self._lock:
            if self._sender is not None or self.closed:
                return
            # (its name is one local.py knows as fork-safe: it waits on its own pipe)
            self._sender = threading.Thread(target=self._send_releases, daemon=True,
                                            name="stoker-node-release")
        self._sender.start()

    def _send_releases(self) -> None:
        while True:
            with self._news:
                self._news.wait_for(lambda: self._released or self.closed or self.closing, 1.0)
                released = list(self._released)
                self._released.clear()
            for bid in released:
                with self._lock:
                    self._held[bid] -= 1
                    if self._held[bid] <= 0:
                        del self._held[bid]
                        self._bytes.pop(bid, None)
                    if not (self.broken or self.closed):
                        try:
                            wire.send(self.sock, wire.Release(bid))
                        except OSError:
                            self.broken = True
            with self._lock:
                done = self.closed or (self.closing and not self._held and not self._released)
            if done:
                self.close()
                return
            if self.closing:  # (what it waits for now is a view's death: no busy loop)
                with self._news:
                    self._news.wait_for(lambda: self._released or self.closed, 1.0)

    # -- ending ----------------------------------------------------------------------------------
    def close_when_free(self) -> None:
        """Closes the connection now, or once the user let go of every batch of it."""
        with self._lock:
            self.closing = True
            free = not self._held and self._sender is None
        if free:
            self.close()
        else:
            self._wake()

    def _wake(self) -> None:
        with self._news:
            self._news.notify()

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            fdpass.untrack(self._fd)
            try:
                self.sock.close()
            except OSError:
                pass
        self._wake()  # the sender, if any, sees `closed` and ends
