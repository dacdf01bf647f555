"""The node's pool: one process per job and user on a machine, serving the workers of every
rank's loaders (``python -m stoker.placements.node.pool JOB``; ranks start it, rendezvous.py).

It detaches as it starts (it is nobody's child: no rank's exit or ``wait`` concerns it), binds
the job's abstract socket (a second pool of the same job finds the name taken and leaves), and
serves connections of its own user only (``wire.check_peer``), one per rank's iterator:

- a ``Hello`` brings the dataset's sealed memfd, its key and the workers' config; the
  connection joins the ``Group`` of that key (made for the first one: group.py), or is
  ``Refused`` with the reason (another protocol version, a config it cannot read);
- ``Task`` / ``Release`` / ``Forget`` / ``Kill`` go to the group; batches, events
  and deaths come back on the same connection (``send``). A message whose handling fails is
  answered, never dropped: the virtual worker it concerns dies, named (``deaths.message_failed``);
- a connection that ends (its iterator finished, or its process died: the pool also watches
  the peer's pidfd, so a descriptor inherited by a child of the rank cannot hide its death)
  leaves its group: its tasks are dropped and its batches let go.

The node's bound (``Budget``: at most N pool workers loading at once, whatever their group) is
made at the first hello; the processes are forked from the pool's template (template.py).

A group no client has used for ``LINGER_S`` ends its workers; the pool exits when it has no
group and no client (also when nobody connected within ``LINGER_S`` of its start), so nothing
outlives the job: when the last rank ends, normally or killed, the pool and its workers follow.

Threads: the main thread accepts and expires idle groups; per connection, one thread reads it
(and runs what its messages ask of the group, under that group's lock) and one writes its outbox
(``_Client.write``: the only writer of that socket, so a rank that pauses reading stalls only
its own messages); per group, one thread waits on its workers (group.py). ``Pool.lock`` guards
the pool's tables (clients, groups, ranks) only: it is never held while a group works or a
process starts, and a group's lock may be taken under it (never the other way round). ``send``
and ``wake`` take no lock of the pool's.
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
import types

from ...common import system as _system
from . import deaths, forked, template, wire
from .budget import Budget
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
    def __init__(self, job: str, listener: socket.socket, forker: template.Forker):
        self.job = job
        self.forker = forker  # where workers are forked from (template.py)
        # Guards the tables below only; never held while a group works or a process starts.
        self.lock = threading.Lock()
        self._listener = listener
        self._clients: dict[int, _Client] = {}
        self._groups: dict[str, Group] = {}
        self.budget: Budget | None = None  # made at the first hello (its ranks say the size)
        self._ranks_expected = 0  # LOCAL_WORLD_SIZE, as the ranks said
        self._ranks_seen: set = set()  # the ranks that joined (their RANK, else their pid)
        # batches (outcomes) each rank process received, over every epoch and group: the rank
        # furthest behind goes first, inside a group and across (groups read and add to it
        # under their own locks: a count a thread loses now and then changes only an order)
        self.tally: collections.Counter = collections.Counter()
        # rank processes seen (pid -> a pidfd of it, -1 when it had ended, None when none could
        # be opened; and the groups it joined): when one ends, its groups keep nothing for it
        self._rank_procs: dict[int, tuple[int | None, set]] = {}
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
        self._ranks_ended()
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
            last = not self._clients and now - self._idle_since > LINGER_S
            if self._clients:
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
                    # Never dropped: the rank waits for an answer. A hello is refused with the
                    # reason; anything about a virtual worker ends that worker, named, and the
                    # rank re-issues its work under its policy.
                    log.exception("stoker node pool: a message from pid %d failed", c.pid)
                    wire.close_all(fds)
                    if isinstance(message, wire.Hello) or c.group is None:
                        c.put(wire.Refused(f"{type(e).__name__}: {e} "
                                           f"({deaths.where_tracebacks_go()})"), ())
                    else:
                        c.group.tell_failed(c.cid, message, e)
                self.wake()
        finally:
            if pidfd is not None:
                os.close(pidfd)
            self._leave(c)

    def _handle(self, c: _Client, m, fds) -> None:
        if isinstance(m, wire.Hello):
            self._hello(c, m, fds)
            return
        wire.close_all(fds)
        g = c.group
        if g is None:
            raise TypeError(f"a {type(m).__name__} before the connection's hello")
        if isinstance(m, wire.Task):
            g.add_task(c.cid, m)
        elif isinstance(m, wire.Release):
            g.release(c.cid, m.bid)
        elif isinstance(m, wire.Forget):
            g.forget(c.cid, m.w, m.gen)
        elif isinstance(m, wire.Kill):
            g.kill(g.kill_targets(c.cid, m.w, m.gen, m.hung))  # (a stack: up to a second)
        else:
            raise TypeError(f"not a message of the node pool: {m!r}")

    def _hello(self, c: _Client, m: wire.Hello, fds) -> None:
        from ...wire.sealed import Sealed

        if getattr(m, "version", None) != wire.VERSION:
            wire.close_all(fds)
            c.put(wire.Refused(f"this node pool speaks version {wire.VERSION} of its protocol "
                               f"and the rank {getattr(m, 'version', '?')}: the rank and the "
                               "pool run different versions of stoker"), ())
            return
        with self.lock:
            if self.budget is None:
                self.budget = Budget(_pool_size(m.workers, m.ranks))
            g = self._groups.get(m.key)
            if g is None:  # (starts no process: workers start as tasks need them)
                m.config.num_workers = self.budget.limit
                n = m.sealed_fds
                sealed = Sealed.adopt(fds[0], fds[1:n])
                stdio, fds[:] = fds[n:n + 2], fds[n + 2:]  # (the group's now, as the Sealed is)
                g = Group(self, m.key, m.config, sealed, self.budget.limit, self.budget,
                          self.forker.context(), stdio)
                self._groups[m.key] = g
            c.group = g
            self._ranks_expected = max(self._ranks_expected, int(m.ranks or 1))
            self._ranks_seen.add(m.rank if m.rank is not None else f"pid {c.pid}")
            more = self._ranks_expected - len(self._ranks_seen)
            groups = list(self._groups.values())
            self._watch_rank(c.pid, g)
        wire.close_all(fds)
        g.attach(c.cid, c.pid)
        for other in groups:
            other.expect(more)
        self.send(c.cid, wire.Ready(os.getpid(), self.job, self.budget.limit, tuple(g.pids()),
                                    g.clients))

    def _watch_rank(self, pid: int, g: Group) -> None:
        """(Under the lock.) Remembers that rank process `pid` joined `g`."""
        known = self._rank_procs.get(pid)
        if known is None:
            try:
                pidfd: int | None = os.pidfd_open(pid)
            except ProcessLookupError:
                pidfd = -1  # (it ended already)
            except OSError:  # (no descriptor free, say: its pid is checked instead)
                pidfd = None
            known = self._rank_procs[pid] = (pidfd, set())
        known[1].add(g)

    def _ranks_ended(self) -> None:
        """Tells each group which of its ranks' processes ended (the main thread's rounds)."""
        ended = []
        with self.lock:
            for pid, (pidfd, groups) in list(self._rank_procs.items()):
                if pidfd is None:
                    if _system.process_state(pid) not in ("", "Z"):
                        continue
                elif pidfd >= 0:
                    if not wire.readable(pidfd, 0):
                        continue
                    os.close(pidfd)
                del self._rank_procs[pid]
                ended.append((pid, groups))
        for pid, groups in ended:
            self.tally.pop(pid, None)
            for g in groups:
                g.rank_gone(pid)

    def _leave(self, c: _Client) -> None:
        with self.lock:
            self._clients.pop(c.cid, None)
        if c.group is not None:
            c.group.detach(c.cid)
        c.close()
        c.shut()
        self.wake()

    # -- what groups call ------------------------------------------------------------------------
    def send(self, cid: int, message, fds=()) -> bool:
        """Queues a message for client `cid` (its writer sends it; `fds` are copied now);
        False when it is gone (its end is handled by its reader). Any thread, any lock held."""
        c = self._clients.get(cid)
        if c is None:
            return False
        c.put(message, fds)
        return True

    def wake(self) -> None:
        """Tokens of the node's budget are free: the groups waiting for them dispatch, furthest
        behind first. Called with no lock held."""
        if self.budget is None:
            return
        for g in self.budget.waiting():
            g.dispatch()


def _pool_size(workers, ranks: int) -> int:
    """The pool's workers: as given, or the CPUs this job may use less one per rank's loop."""
    if workers != "auto":
        return int(workers)
    return max(1, _system.usable_cpus() - max(1, int(ranks or 1)))


def _serving(job: str, listener: socket.socket, forker: template.Forker) -> None:
    """Serves the job from this process, detached (see ``_detach``)."""
    try:  # the starting rank may be bound to its own cores; the pool serves the node's
        os.sched_setaffinity(0, range(os.cpu_count() or 1))
    except OSError:
        pass
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    Pool(job, listener, forker).serve()


def serve_forked(job: str, listener: socket.socket) -> None:
    """The pool in a fork of a rank (rendezvous.py), the job's name bound already: it lets go
    of the rank (forked.py), forks its template before it starts any thread, and serves. Never
    returns (the rank's code, its exit handlers, must not run here)."""
    code = 1
    try:
        os.setsid()  # (nobody's child: the rank's intermediate process has exited)
        forked.become("stoker-pool", {listener.fileno()})
        pid, link = template.fork_template()
        # The template keeps the rank's __main__ (its workers find the script's classes there);
        # the pool does not: a fork server it may start would run the script's top level in
        # every worker (a worker that needs the script is told so by its own config).
        sys.modules["__main__"] = sys.modules["__mp_main__"] = types.ModuleType("__main__")
        _serving(job, listener, template.for_pool(link, pid))
        code = 0
    except BaseException:
        import traceback

        try:
            traceback.print_exc()
        except BaseException:
            pass
    finally:
        os._exit(code)


def _detach() -> None:
    """Forks; the first process exits (its parent, a rank, reaps it at once), the second goes
    on in its own session with nothing of the terminal."""
    if os.fork() > 0:
        os._exit(0)
    os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C is for the ranks; they leave, it ends
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def main(argv: list[str]) -> int:
    """``JOB``: the pool as a fresh interpreter (where a rank could not be forked into one:
    rendezvous.py); its workers come from a fork server."""
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
    forked.set_name("stoker-pool")
    _serving(job, listener, template.for_pool(None))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
