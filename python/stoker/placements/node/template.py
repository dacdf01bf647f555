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

This module is the template's side: its fork server (``serve``: a fork per request) and its
children's bookkeeping (``reap``: each exit status told to the pool). The pool's side is
forker.py; their messages are link.py's table.

Thread contract: ``fork_template`` runs in the pool before it starts any thread; everything else
here runs in the template, which has one thread.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import socket
import sys

from ...common import system as _system  # noqa: F401 (imported before forking: the workers need it anyway)
from . import forked, link, wire

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
    sock = socket.socket(fileno=link_fd)
    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    wire.send(sock, link.Started(os.getpid()))
    serve(sock, r, (link_fd, r, w))


def serve(sock, wakeup: int, own: tuple) -> None:
    """The fork server: a worker forked per ``link.Fork``, children reaped as SIGCHLD wakes it
    (on `wakeup`); returns when the pool's link ends. `own`: the descriptors a child closes."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    poller.register(wakeup, select.POLLIN)
    while True:
        for fd, _ in poller.poll():
            if fd == wakeup:
                _drain(wakeup)
                continue
            try:
                got = wire.recv(sock)
            except OSError:  # (a pool that lost the race for the job's name resets it)
                got = None
            if got is None:
                return  # the pool ended: so does the template (its workers see their EOF)
            message, fds = got
            if not isinstance(message, link.Fork):
                wire.close_all(fds)
                raise TypeError(f"not a message to the node pool's template: {message!r}")
            _fork(sock, message, fds, own)
        reap(sock)


def _drain(fd: int) -> None:
    while True:
        try:
            if not os.read(fd, 512):
                return
        except BlockingIOError:
            return


def _fork(sock, request: link.Fork, fds: list, own: tuple) -> None:
    """One worker, forked for `request`; the pool hears its pid, with a pidfd of it."""
    child = os.fork()
    if child == 0:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for sig in (signal.SIGHUP, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        for fd in own:
            os.close(fd)
        _fds[:] = fds
        os._exit(_bootstrap(request.payload))
    wire.close_all(fds)
    # a pidfd made before this process can reap it: it names that child for good, even once
    # its pid is reused
    pidfd = os.pidfd_open(child)
    try:
        wire.send(sock, link.Forked(request.rid, child), [pidfd])
    finally:
        os.close(pidfd)


def reap(sock) -> None:
    """Every child that ended: its status told to the pool (``link.Exited``)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        # (multiprocessing's convention: the exit code, or minus the signal's number)
        wire.send(sock, link.Exited(pid, os.waitstatus_to_exitcode(status)))


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


class InheritedFd:
    """A descriptor a worker's Process pickle refers to, by its place among those its request
    passed (``multiprocessing.reduction.DupFd`` under the template)."""

    def __init__(self, place: int):
        self.place = place

    def detach(self) -> int:
        return _fds[self.place]
