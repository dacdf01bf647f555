"""The pool's tables and its main thread: it accepts connections of its own user only
(``wire.check_peer``), one per rank's iterator (session.py serves each), makes a ``Group`` for
the first hello of each key, and ends what lingers.

The node's bound (``Budget``: at most N pool workers loading at once, whatever their group) is
made at the first hello; a group's processes are the local placement's own (``LocalProcesses``,
forked by the pool's ``Forker``: forker.py), built here and handed to the group.

A group no client has used for ``LINGER_S`` ends its workers; the pool ends when it has no
group and no client (also when nobody connected within ``LINGER_S`` of its start), so nothing
outlives the job: when the last rank ends, normally or killed, the pool and its workers follow.

Thread contract: the main thread accepts and expires idle groups (``serve``); per connection, a
reader and a writer thread (session.py); per group, one thread waits on its workers (group.py).
``Pool.lock`` guards the pool's tables (sessions, groups, ranks) only: it is never held while a
group works or a process starts, and a group's lock may be taken under it (never the other way
round). ``send`` and ``wake`` take no lock of the pool's.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import socket
import threading
import time

from ...common import system as _system
from ...wire.board import Board
from ..local import LocalProcesses
from . import session, wire
from .budget import Budget, worker_cpus
from .group import Group
from .ranks import Ranks

log = logging.getLogger("stoker")

LINGER_S = float(os.environ.get("STOKER_NODE_LINGER_S", "5"))


class Pool:
    def __init__(self, job: str, listener: socket.socket, forker):
        self.job = job
        self.forker = forker  # where workers are forked from (forker.py)
        # Guards the tables below only; never held while a group works or a process starts.
        self.lock = threading.Lock()
        self._listener = listener
        self._sessions: dict[int, session.Session] = {}
        self._groups: dict[str, Group] = {}
        self.budget: Budget | None = None  # made at the first hello (its ranks say the size)
        self.ranks = Ranks()
        # batches (outcomes) each rank process received, over every epoch and group: the rank
        # furthest behind goes first, inside a group and across (groups read and add to it
        # under their own locks: a count a thread loses now and then changes only an order)
        self.tally: collections.Counter = collections.Counter()
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
                s = session.Session(self._next, sock, pid)
                self._sessions[s.cid] = s
            threading.Thread(target=session.read, args=(self, s),
                             name=f"stoker-node-client-{s.cid}", daemon=True).start()
            threading.Thread(target=s.write, name=f"stoker-node-writer-{s.cid}",
                             daemon=True).start()

    def _expire(self) -> bool:
        """Ends groups idle for LINGER_S; True when the pool itself should end."""
        with self.lock:
            ended_ranks = self.ranks.ended()
        for pid, groups in ended_ranks:
            self.tally.pop(pid, None)
            for g in groups:
                g.rank_gone(pid)
        now = time.monotonic()
        with self.lock:
            groups = list(self._groups.items())
        ended = [(k, g) for k, g in groups
                 # (a broken group goes with its last client: a rank restarted by its launcher
                 # gets new workers, not that group's verdict)
                 if not g.clients and (now - g.idle_since > LINGER_S or g.broken is not None)]
        with self.lock:
            for k, g in ended:
                if self._groups.get(k) is g:
                    del self._groups[k]
            last = not self._sessions and now - self._idle_since > LINGER_S
            if self._sessions:
                self._idle_since = now
            if last:
                self._listener.close()  # no connection can arrive from here on
                ended += list(self._groups.items())
                self._groups.clear()
        for _, g in ended:
            g.close()
            # its workers end, and no thread of ours may be in the engine's C++ when the
            # interpreter exits
            g.end()
        if last:
            self.forker.close()
        return last

    # -- what a connection's reader calls (session.py) -------------------------------------------
    def join(self, s: session.Session, m: wire.Hello, fds) -> None:
        """A hello: `s` joins the group of its key, made for the first one."""
        from ...wire.sealed import Sealed

        with self.lock:
            if self.budget is None:
                self.budget = Budget(pool_size(m.workers, m.ranks))
            g = self._groups.get(m.key)
            if g is None:  # (starts no process: workers start as tasks need them)
                m.config.num_workers = self.budget.limit
                m.config.load = dataclasses.replace(
                    m.config.load, cpus=worker_cpus(self.budget.limit, m.ranks))
                n = m.sealed_fds
                sealed = Sealed.adopt(fds[0], fds[1:n])
                stdio, fds[:] = fds[n:n + 2], fds[n + 2:]  # (the group's now, as the Sealed is)
                g = self._group(m, sealed, stdio)
                self._groups[m.key] = g
            s.group = g
            more = self.ranks.joined(m.rank, s.pid, m.ranks, g)
            groups = list(self._groups.values())
        wire.close_all(fds)
        g.attach(s.cid, s.pid)
        for other in groups:
            other.expect(more)
        self.send(s.cid, wire.Ready(os.getpid(), self.job, self.budget.limit, tuple(g.pids()),
                                    g.clients))

    def _group(self, m: wire.Hello, sealed, stdio) -> Group:
        """(Under the lock.) The group of `m`'s key: its board, its processes (none started:
        they start as its tasks need them) and its thread."""
        assert self.budget is not None  # (join made it first)
        size = self.budget.limit
        # A board of its own: `stoker top` and `stoker doctor` see the pool and its workers
        # (their status pages carry its token), counted once for every rank it serves.
        board = Board(size, f"stoker node pool {self.job}")
        workers = LocalProcesses(self.forker.context(), size, board.token, sealed=sealed,
                                 keep_slot_fds=True)
        g = Group(self, m.key, m.config, sealed, self.budget, workers, board, stdio)
        g.start()
        return g

    def leave(self, s: session.Session) -> None:
        with self.lock:
            self._sessions.pop(s.cid, None)
        if s.group is not None:
            s.group.detach(s.cid)
        s.close()
        s.shut()
        self.wake()

    # -- what groups call ------------------------------------------------------------------------
    def send(self, cid: int, message, fds=()) -> bool:
        """Queues a message for connection `cid` (its writer sends it; `fds` are copied now);
        False when it is gone (its end is handled by its reader). Any thread, any lock held."""
        s = self._sessions.get(cid)
        if s is None:
            return False
        s.put(message, fds)
        return True

    def wake(self) -> None:
        """Tokens of the node's budget are free: the groups waiting for them dispatch, furthest
        behind first. Called with no lock held."""
        if self.budget is None:
            return
        for g in self.budget.waiting():
            g.dispatch()


def pool_size(workers, ranks: int) -> int:
    """The pool's workers: as given, or the CPUs this job may use less one per rank's loop."""
    if workers != "auto":
        return int(workers)
    return max(1, _system.usable_cpus() - max(1, int(ranks or 1)))
