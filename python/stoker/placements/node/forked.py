"""Making a fork of a rank into a process of the pool's (the pool itself, its template): what it
must let go of, so that it holds nothing of the rank but memory it shares with it.

- every descriptor but those it keeps becomes ``/dev/null``: what it held (a socket to a peer
  rank, a file) is let go of here, and its number stays taken, so that an object of the rank
  that closes "its" descriptor later (a file object multiprocessing closes as a child starts, a
  finalizer) closes a ``/dev/null``, never a descriptor this process got since with that number;
- ``sys.stdin``, ``stdout`` and ``stderr`` (and their ``__x__`` twins) are made the standard
  descriptors again: the rank's may be on descriptors just let go of (pytest's capture, a tee);
- engine descriptors the rank tracked are forgotten (their numbers are /dev/null now);
- the collector is frozen: the rank's objects are never collected here, so none of them runs a
  finalizer; objects made from here on are collected as usual;
- Ctrl+C and a hang-up are for the ranks, ignored here; a SIGTERM ends it;
- multiprocessing's own servers are the rank's no more: a fork server or resource tracker the
  rank started is not this process's child, and their descriptors are /dev/null here, so the
  module-level ones are made anew (this process starts its own when it needs one);
- its name (``/proc/self/comm``, what ``ps -o comm`` and ``top`` show) says what it is.

It never returns to the rank's code: its owner ends it with ``os._exit``.

Runs in the new process, before it starts any thread.
"""

from __future__ import annotations

import gc
import io
import os
import signal
import sys

from ...wire import fdpass


def become(name: str, keep: set) -> None:
    gc.freeze()
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _let_go_of_descriptors(keep | {0, 1, 2})
    fdpass.forget_all()
    sys.stdin = open(0, closefd=False)
    # (unbuffered underneath: a traceback printed just before os._exit reaches the descriptor)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True)
    for stream in ("stdin", "stdout", "stderr"):  # (faulthandler and others use these)
        setattr(sys, f"__{stream}__", getattr(sys, stream))
    _fresh_multiprocessing()
    set_name(name)


def set_name(name: str) -> None:
    """This process's name (``/proc/self/comm``: what ``ps -o comm`` and ``top`` show)."""
    try:
        with open("/proc/self/comm", "w") as f:
            f.write(name[:15])
    except OSError:
        pass


def _fresh_multiprocessing() -> None:
    """multiprocessing's fork server and resource tracker, and the children it knows of, as in
    a process that never started any (the module-level functions are bound to the instances)."""
    from multiprocessing import forkserver, process, resource_tracker

    server = forkserver.ForkServer()
    forkserver._forkserver = server  # type: ignore[attr-defined]
    for name in ("ensure_running", "get_inherited_fds", "connect_to_new_process",
                 "set_forkserver_preload"):
        if hasattr(forkserver, name):
            setattr(forkserver, name, getattr(server, name))
    tracker = resource_tracker.ResourceTracker()
    resource_tracker._resource_tracker = tracker  # type: ignore[attr-defined]
    for name in ("ensure_running", "register", "unregister", "getfd"):
        if hasattr(resource_tracker, name):
            setattr(resource_tracker, name, getattr(tracker, name))
    process._children.clear()  # type: ignore[attr-defined]  # (the rank's, not ours)


def _let_go_of_descriptors(keep: set) -> None:
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
