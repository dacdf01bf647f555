"""The pool's side of its template (template.py): where a group's workers are forked from.

``Link`` is the pool's end of the template's link (one request at a time, a reader thread for
its answers: a fork's pid and a pidfd of it, a child's exit status; link.py's messages).
``Forker`` is what groups start workers with: a multiprocessing context whose processes come
from the template while it lives, else from a fork server (made on first need, with the engine,
and so torch, imported once in it; also where the pool is a fresh interpreter, with no
template).

Thread contract: ``Link`` and ``Forker`` may be used from any thread of the pool; a fork
request holds the link's lock for the few milliseconds of a fork.
"""

from __future__ import annotations

import io
import itertools
import logging
import os
import pickle
import signal
import socket
import threading
from multiprocessing import context, process, reduction

from . import link, template, wire

log = logging.getLogger("stoker")

FORK_TIMEOUT_S = 10.0  # a fork answers in milliseconds; a template that does not is dead


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
        if got is None or not isinstance(got[0], link.Started):
            if got is not None:
                wire.close_all(got[1])
            self.alive = False
            sock.close()
            return
        self.pid = got[0].pid
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
                if isinstance(message, link.Forked) and fds:
                    self._answers[message.rid] = (message.pid, fds[0])
                    self._exits.pop(message.pid, None)  # (a pid reused: not that one's end)
                    fds = fds[1:]
                elif isinstance(message, link.Exited):
                    self._exits[message.pid] = message.code
                wire.close_all(fds)
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
            wire.send(self._sock, link.Fork(rid, payload), fds)
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
    def DupFd(place: int) -> template.InheritedFd:  # noqa: N802 (multiprocessing's name)
        return template.InheritedFd(place)

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
