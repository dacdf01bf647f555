"""The node's pool process: one per job and user on a machine, serving the workers of every
rank's loaders (``python -m stoker.placements.node.pool JOB``; ranks start it, rendezvous.py).

This module is the process's life: it starts as a fork of a rank (``serve_forked``: it lets go
of the rank, forks its template before it starts any thread) or as a fresh interpreter
(``main``: its workers then come from a fork server), detaches (it is nobody's child: no rank's
exit or ``wait`` concerns it), binds the job's abstract socket (a second pool of the same job
finds the name taken and leaves) and serves (server.py) until nothing is left to serve; then it
exits, and its template with it. What it serves: server.py (accepting, groups, lingering),
session.py (one connection), group.py (one dataset's workers), forker.py and template.py (where
the workers come from).

Thread contract: everything here runs in the process's main thread, before any other starts
(``serve_forked`` forks the template first) or after ``Pool.serve`` returned.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import types

from . import forked, forker, template, wire
from .server import Pool


def _serving(job: str, listener: socket.socket, source: forker.Forker) -> None:
    """Serves the job from this process, detached (see ``_detach``)."""
    try:  # the starting rank may be bound to its own cores; the pool serves the node's
        os.sched_setaffinity(0, range(os.cpu_count() or 1))
    except OSError:
        pass
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    Pool(job, listener, source).serve()


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
        _serving(job, listener, forker.for_pool(link, pid))
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
    _serving(job, listener, forker.for_pool(None))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
