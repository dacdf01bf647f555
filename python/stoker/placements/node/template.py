"""Where the pool's workers are forked from: a warm template, or else a fresh fork server.

A pool worker must start as fast as a rank's own forked worker and cost as little memory: it
needs torch and the engine imported, which takes a fresh interpreter seconds and over a hundred
MB of private memory. The pool is a fork of the rank that started it (rendezvous.py), and before
it starts any thread it forks its *template* (``fork_template``): a single-threaded copy, torch
already imported, whose pages it shares with that rank and the pool (copy-on-write). The
template forks one worker per request of the pool, in milliseconds, and every worker shares the
same pages. Like the pool, it holds nothing of the rank but memory (forked.py), and it runs no
code of the rank's; it reaps its workers and tells the pool each one's exit status, and ends
when the pool's link does.

Where the rank could not be forked (CUDA initialised there: a forked CUDA context cannot be
used; other Python threads: a lock one holds would stay held), the pool is a fresh interpreter
and its workers come from a fresh fork server, as they also do when the template dies (killed
from outside).

Memory the rank frees or rewrites after the fork stays held by the pool and its template, shared
between them (as by a persistent forked worker), for the job's life: the first iteration of a
loader with ``placement=stoker.Node()`` is when it is forked, usually after the model went to
the GPU.

The pool side: ``Link`` talks to the template (one request at a time, a reader thread for its
answers: a fork's pid and a pidfd of it, a child's exit status), ``Forker`` is what groups start
workers with (a multiprocessing context: the template's while it lives, else the fork server's).

Thread contract: ``fork_template`` runs in the pool before it starts any thread. ``Link`` and
``Forker`` may be used from any thread of the pool; a fork request holds the link's lock for the
few milliseconds of a fork.
"""

from __future__ import annotations

import io
import itertools
import logging
import os
import pickle
import select
import signal
import socket
import sys
import threading
from multiprocessing import context, process, reduction

from ...common import system as _system  # noqa: F401 (imported before forking: the workers need it anyway)
from . import forked, wire

log = logging.getLogger("stoker")

FORK_TIMEOUT_S = 10.0  # a fork answers in milliseconds; a template that does not is dead

# -- the template (a fork of a rank) --------------------------------------------------------------


def can_fork() -> bool:
    """Whether this rank may be forked into a template: not with CUDA initialised here."""
    torch = sys.modules.get("torch")
    try:
        return not (torch is not None and torch.cuda.is_initialized())
    except Exception:
        return False


def fork_template() -> tuple[int, int]:
    """Forks the template of this process (the pool, itself a fork of a rank, before it starts
    any thread): (its pid, the pool's end of their link). The template says hello on the link
    with its pid and its ``__main__``; it ends when the link does."""
    pool_end, template_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid:
        template_end.close()
        return pid, pool_end.detach()
    try:
        pool_end.close()
        _template(template_end.detach())
    except BaseException:
        import traceback

        try:  # (the rank's stderr: the pool then starts its workers from a fork server)
            traceback.print_exc()
        except BaseException:
            pass
    finally:
        os._exit(0)


_fds: list[int] = []  # in a worker the template forked: the descriptors its request passed


def _template(link_fd: int) -> None:
    forked.become("stoker-template", {link_fd})
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # (the pool's link says when it ends)
    link = socket.socket(fileno=link_fd)
    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    wire.send(link, ("hello", os.getpid()))
    poller = select.poll()
    poller.register(link, select.POLLIN)
    poller.register(r, select.POLLIN)
    while True:
        for fd, _ in poller.poll():
            if fd == r:
                while True:
                    try:
                        if not os.read(r, 512):
                            break
                    except BlockingIOError:
                        break
                continue
            try:
                got = wire.recv(link)
            except OSError:  # (a pool that lost the race for the job's name resets it)
                got = None
            if got is None:
                return  # the pool ended: so does the template (its workers see their EOF)
            (rid, payload), fds = got
            child = os.fork()
            if child == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for sig in (signal.SIGHUP, signal.SIGTERM):
                    signal.signal(sig, signal.SIG_DFL)
                for fd in (link_fd, r, w):
                    os.close(fd)
                _fds[:] = fds
                os._exit(_bootstrap(payload))
            wire.close_all(fds)
            # a pidfd made before this process can reap it: it names that child for good, even
            # once its pid is reused
            pidfd = os.pidfd_open(child)
            try:
                wire.send(link, ("forked", rid, child), [pidfd])
            finally:
                os.close(pidfd)
        _reap(link)


def _reap(link) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        # (multiprocessing's convention: the exit code, or minus the signal's number)
        wire.send(link, ("exited", pid, os.waitstatus_to_exitcode(status)))


def _bootstrap(payload: bytes) -> int:
    """In a worker forked by the template: the Process the pool asked for, run as
    multiprocessing's own children run theirs."""
    try:
        process_obj = pickle.loads(payload)
        return process_obj._bootstrap(parent_sentinel=None)
    except BaseException:
        import traceback

        traceback.print_exc()
        return 1


class _InheritedFd:
    """A descriptor a worker's Process pickle refers to, by its place among those its request
    passed (``multiprocessing.reduction.DupFd`` under the template)."""

    def __init__(self, place: int):
        self.place = place

    def detach(self) -> int:
        return _fds[self.place]


# -- the pool's side ----------------------------------------------------------------------------


class Link:
    """The pool's end of its template's link: ``fork`` asks for a worker, ``status`` waits for
    one's exit status. Dead when the template ended (killed from outside)."""

    def __init__(self, sock: socket.socket, child: int | None = None):
        self._sock = sock
        self._child = child  # the template, when it is this process's child: reaped at its end
        self._lock = threading.Lock()  # one request at a time
        self._cond = threading.Condition()
        self._answers: dict[int, tuple] = {}  # request -> (pid, its pidfd)
        self._exits: dict[int, int] = {}  # pid -> return code
        self._ids = itertools.count(1)
        self.alive = True
        self.pid: int | None = None
        got = wire.recv(sock) if wire.readable(sock, FORK_TIMEOUT_S) else None
        if got is None or got[0][0] != "hello":
            self.alive = False
            sock.close()
            return
        _, self.pid = got[0]
        threading.Thread(target=self._read, name="stoker-node-template", daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                got = wire.recv(self._sock)
            except OSError:
                got = None
            with self._cond:
                if got is None:
                    self.alive = False
                    self._cond.notify_all()
                    self._reap()
                    return
                message, fds = got
                if message[0] == "forked" and fds:
                    self._answers[message[1]] = (message[2], fds[0])
                    self._exits.pop(message[2], None)  # (a pid reused: not that one's end)
                elif message[0] == "exited":
                    self._exits[message[1]] = message[2]
                self._cond.notify_all()

    def _reap(self) -> None:
        if self._child is not None:
            try:
                os.waitpid(self._child, 0)
            except ChildProcessError:
                pass

    def fork(self, payload: bytes, fds: list[int]) -> tuple[int, int]:
        """A new worker running the pickled Process `payload`, with `fds`: its pid and a pidfd
        of it (the caller's)."""
        with self._lock:
            rid = next(self._ids)
            wire.send(self._sock, (rid, payload), fds)
            with self._cond:
                if not self._cond.wait_for(lambda: rid in self._answers or not self.alive,
                                           FORK_TIMEOUT_S):
                    raise OSError("stoker: the node pool's template did not fork a worker")
                if rid not in self._answers:
                    raise OSError("stoker: the node pool's template ended")
                return self._answers.pop(rid)

    def status(self, pid: int, timeout: float | None) -> int | None:
        """`pid`'s return code once the template reaped it (None: not within `timeout`, or the
        template is gone)."""
        with self._cond:
            self._cond.wait_for(lambda: pid in self._exits or not self.alive, timeout)
            return self._exits.get(pid)

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class _Popen:
    """multiprocessing's Popen for a worker the template forks: the Process is pickled as for
    forkserver (descriptors it refers to passed beside it), the exit status comes from the
    template, which is its parent; ``sentinel`` is a pidfd (readable when it ends)."""

    method = "template"

    def __init__(self, process_obj, link: Link):
        self._link = link
        self._fds: list[int] = []
        self.returncode = None
        self.finalizer = None
        buf = io.BytesIO()
        context.set_spawning_popen(self)  # type: ignore[arg-type]  # (its protocol)
        try:
            reduction.ForkingPickler(buf, pickle.HIGHEST_PROTOCOL).dump(process_obj)
        finally:
            context.set_spawning_popen(None)
        self.pid, self.sentinel = link.fork(buf.getvalue(), self._fds)

    def duplicate_for_child(self, fd: int) -> int:
        self._fds.append(fd)
        return len(self._fds) - 1

    @staticmethod
    def DupFd(place: int) -> _InheritedFd:  # noqa: N802 (multiprocessing's name)
        return _InheritedFd(place)

    def poll(self, flag=os.WNOHANG):
        return self.wait(0 if flag == os.WNOHANG else None)

    def wait(self, timeout=None):
        if self.returncode is None:
            code = self._link.status(self.pid, timeout)
            # (its status went with the template: it was killed, or ends with the pool)
            if code is None and not self._link.alive and self._ended(timeout):
                code = -signal.SIGKILL
            self.returncode = code
        return self.returncode

    def _ended(self, timeout: float | None = 0) -> bool:
        """Whether the process ended (waiting up to `timeout`; None: until it does)."""
        return wire.readable(self.sentinel, -1 if timeout is None else timeout)

    def _signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                signal.pidfd_send_signal(self.sentinel, sig)
            except (ProcessLookupError, OSError):
                pass

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def close(self) -> None:
        if self.sentinel >= 0:
            os.close(self.sentinel)
            self.sentinel = -1


class TemplateProcess(process.BaseProcess):
    """A worker process the pool's ``Forker`` starts (the template's fork, or the fork
    server's); pickled by name into the child, as multiprocessing's own Process classes are."""

    _start_method = None  # (a child keeps the default context of the rank it is a copy of)

    @staticmethod
    def _Popen(process_obj):  # noqa: N802 (multiprocessing's name)
        if _forker is None:
            raise RuntimeError("stoker: no node-pool Forker in this process")
        return _forker.popen(process_obj)


class TemplateContext(context.BaseContext):
    _name = "template"
    Process = TemplateProcess


_forker: Forker | None = None  # the pool's (one a process)


class Forker:
    """What the pool's groups start workers with: ``context()``, a multiprocessing context
    whose processes come from the template while it lives, else from a fork server (made on
    first need, with the engine, and so torch, imported once in it)."""

    def __init__(self, link: Link | None):
        global _forker
        self.link = link if link is not None and link.alive else None
        self._forkserver = None
        self._context = TemplateContext()
        _forker = self

    def context(self):
        return self._context

    def popen(self, process_obj):
        link = self.link
        if link is not None and link.alive:
            try:
                return _Popen(process_obj, link)
            except OSError as e:
                log.warning("stoker node pool: its template cannot fork (%s): workers start "
                            "from a fork server from now on", e)
                self.link = None
        return self._fallback().Process._Popen(process_obj)

    def _fallback(self):
        if self._forkserver is None:
            ctx = context._default_context.get_context("forkserver")
            ctx.set_forkserver_preload(["stoker.worker.process", "stoker.placements.local"])
            self._forkserver = ctx
        return self._forkserver

    def close(self) -> None:
        if self.link is not None:
            self.link.close()


def for_pool(link_fd: int | None, template_pid: int | None = None) -> Forker:
    """The pool's Forker: over the template at `link_fd` (its child `template_pid`, reaped when
    their link ends), when it says hello; else the fork server alone."""
    link = None
    if link_fd is not None:
        try:
            link = Link(socket.socket(fileno=link_fd), template_pid)
        except OSError:
            link = None
    return Forker(link)
