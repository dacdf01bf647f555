"""Where the pool's workers are forked from: a warm template, a fork of the rank that started
the pool, or else a fresh fork server.

A pool worker must start as fast as a rank's own forked worker and cost as little memory: it
needs torch and the engine imported, which takes a fresh interpreter seconds and over a hundred
MB of private memory. So the rank that starts the pool (rendezvous.py) also forks a *template*
of itself (``fork_template``): a detached, single-threaded copy, torch already imported, whose
pages it shares with that rank (copy-on-write); the template forks one worker per request of the
pool, in milliseconds, and every worker shares the same pages. The template holds nothing of
the rank but its memory: it closes every descriptor but its link to the pool and the standard
streams (a rank's sockets to its peers must not outlive the rank), freezes the garbage
collector (the rank's objects are never collected there, so none closes a descriptor number the
template reuses), and runs no code of the rank's. It ends when the pool's link ends.

The template is not made (``can_fork``) when the rank has CUDA initialised, as local workers then
use forkserver (a forked CUDA context cannot be used): the pool then starts its workers from a
fresh fork server, as it does when the template dies (killed from outside) or was never given.

Memory the rank frees after the template was forked stays held by the template (as by a
persistent forked worker), for the pool's life: the first iteration of a loader with
``placement=stoker.Node()`` is when it is forked, usually after the model went to the GPU.

The pool side: ``Link`` talks to the template (one request at a time, a reader thread for its
answers: a fork's pid, a child's exit status), ``Forker`` is what groups start workers with (a
multiprocessing context: the template's while it lives, else the fork server's).

Thread contract: ``fork_template`` runs in a rank, on the thread that starts the pool. ``Link``
and ``Forker`` may be used from any thread of the pool; a fork request holds the link's lock
for the few milliseconds of a fork.
"""

from __future__ import annotations

import gc
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

from ... import _system  # noqa: F401 (imported before forking: the workers need it anyway)
from . import wire

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


def fork_template(link_fd: int) -> None:
    """Forks a detached template of this process serving the pool over `link_fd` (a
    SOCK_SEQPACKET end); returns at once in this process (the intermediate child is reaped
    here). The template says hello on the link with its pid and its ``__main__``."""
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)
        return
    try:  # the intermediate child: a new session, and the template is nobody's child
        os.setsid()
        if os.fork():
            os._exit(0)
        _template(link_fd)
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
    gc.freeze()
    gc.disable()
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    keep = {0, 1, 2, link_fd}
    _let_go_of_descriptors(keep)
    from ...engine import fdpass

    fdpass.forget_all()  # (their numbers are free now: a worker must not close them again)
    # The rank's sys.stdin/stdout/stderr may be on descriptors just closed (pytest's capture, a
    # logging tee), whose numbers a worker's descriptors may take (multiprocessing closes
    # sys.stdin as a child starts): the template's, and its workers', are the standard ones.
    sys.stdin = open(0, closefd=False)
    sys.stdout = io.TextIOWrapper(open(1, "wb", closefd=False), line_buffering=True)
    sys.stderr = io.TextIOWrapper(open(2, "wb", closefd=False), write_through=True)
    for name in ("stdin", "stdout", "stderr"):  # (faulthandler and others use these)
        setattr(sys, f"__{name}__", getattr(sys, name))
    link = socket.socket(fileno=link_fd)
    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    keep |= {r, w}
    signal.set_wakeup_fd(w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    wire.send(link, ("hello", os.getpid(), main))
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
                gc.enable()  # (the rank's objects stay frozen: never collected here either)
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
        wire.send(link, ("exited", pid, _returncode(status)))


def _returncode(status: int) -> int:
    """multiprocessing's convention: the exit code, or minus the signal's number."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


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


def _let_go_of_descriptors(keep: set) -> None:
    """Every descriptor of the rank but `keep` is made /dev/null: what it held (a socket to a
    peer rank, a file) is let go of here, and its number stays taken, so that an object of the
    rank that closes "its" descriptor later (a file object multiprocessing closes as a child
    starts, a finalizer) closes a /dev/null, never a descriptor the template or a worker got
    since with the same number."""
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        held = [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        held = list(range(3, 1024))
    for fd in held:
        if fd in keep or fd == null:
            continue
        try:
            os.dup2(null, fd, inheritable=False)
        except OSError:  # (the listing's own descriptor, closed already)
            pass


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

    def __init__(self, sock: socket.socket):
        self._sock = sock
        self._lock = threading.Lock()  # one request at a time
        self._cond = threading.Condition()
        self._answers: dict[int, tuple] = {}  # request -> (pid, its pidfd)
        self._exits: dict[int, int] = {}  # pid -> return code
        self._ids = itertools.count(1)
        self.alive = True
        self.pid: int | None = None
        self.main: str | None = None
        got = wire.recv(sock) if _readable(sock, FORK_TIMEOUT_S) else None
        if got is None or got[0][0] != "hello":
            self.alive = False
            sock.close()
            return
        _, self.pid, self.main = got[0]
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
                    return
                message, fds = got
                if message[0] == "forked" and fds:
                    self._answers[message[1]] = (message[2], fds[0])
                    self._exits.pop(message[2], None)  # (a pid reused: not that one's end)
                elif message[0] == "exited":
                    self._exits[message[1]] = message[2]
                self._cond.notify_all()

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


def _readable(sock, timeout_s: float) -> bool:
    p = select.poll()
    p.register(sock, select.POLLIN)
    return bool(p.poll(int(timeout_s * 1000)))


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
            if code is None and not self._link.alive and self._ended():
                code = -signal.SIGKILL  # (its status went with the template: it was killed)
            self.returncode = code
        return self.returncode

    def _ended(self) -> bool:
        return bool(select.select([self.sentinel], [], [], 0)[0])

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
            ctx.set_forkserver_preload(["stoker.engine.process", "stoker.placements.local"])
            self._forkserver = ctx
        return self._forkserver

    @property
    def template_pid(self) -> int | None:
        link = self.link
        return link.pid if link is not None and link.alive else None

    def close(self) -> None:
        if self.link is not None:
            self.link.close()


def for_pool(link_fd: int | None) -> Forker:
    """The pool's Forker: over the template at `link_fd` (given by the rank that started the
    pool), when it says hello; else the fork server alone."""
    link = None
    if link_fd is not None:
        try:
            link = Link(socket.socket(fileno=link_fd))
        except OSError:
            link = None
    return Forker(link)


