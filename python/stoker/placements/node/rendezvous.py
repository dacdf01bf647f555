"""Finding the node's pool: which job this process belongs to, and a connection to the pool of
that job and user, started here when there is none yet.

The first rank that needs the pool starts it: where this rank can be forked (no CUDA initialised,
no other Python thread), as a fork of itself, which binds the job's name here first and forks
the template the pool's workers come from (template.py); else as a fresh interpreter (``python
-m stoker.placements.node.pool``). Either detaches at once: it is nobody's child and outlives no
one (docs/design/node.md). Every rank then connects. Two ranks starting it at once is harmless:
the name is bound by one pool only (the other sees ``EADDRINUSE`` and leaves), and both ranks
connect to the one that bound it.

Runs on the thread that starts an iterator's workers.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from ...common.errors import EngineError
from ..local import other_threads as _other_threads
from . import template, wire

CONNECT_TIMEOUT_S = 60.0  # a pool just started imports Python and binds within a second
# A pool started here that binds no name within this long is started again: the process that
# was to become it may have died first (killed while it imported, by the OOM killer say).
START_AGAIN_S = 5.0


def job_name(spec) -> str:
    """The job this process's ranks share: torchrun's run id, else the rendezvous address, else
    the name given (``Node(name=...)``); without any, this process alone."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id and run_id != "none":
        return f"torchelastic:{run_id}"
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if addr and port:
        return f"master:{addr}:{port}"
    if spec.name:
        return f"name:{spec.name}"
    return f"process:{os.getpid()}"


def _start_pool(job: str) -> int:
    """Starts the pool of `job`: a fork of this rank where it can be forked (its template and
    workers then start in milliseconds from pages this rank already has: template.py), else a
    fresh interpreter. Returns 0 once the name is bound (here, or found held), a negative number
    when the process that was to bind it was killed first, a positive one when it failed."""
    if template.can_fork() and not _other_threads():
        return _fork_pool(job)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    env["STOKER_NODE_POOL"] = "1"  # stoker's import leaves torch out of the pool (__init__.py)
    # It detaches (forks and its first process exits): waiting here reaps that first process.
    # Its stdout and stderr are this rank's: what a dataset prints in a pool worker shows there.
    try:
        return subprocess.run([sys.executable, "-m", "stoker.placements.node.pool", job],
                              env=env, stdin=subprocess.DEVNULL, start_new_session=True,
                              check=False, timeout=CONNECT_TIMEOUT_S).returncode
    except subprocess.TimeoutExpired:
        return -1


def _fork_pool(job: str) -> int:
    """Binds the job's name here, then forks the pool with it (through an intermediate process
    that exits at once, so the pool is nobody's child); this rank keeps no copy of it."""
    from . import pool

    listener = wire.new_socket()
    try:
        listener.bind(wire.address(job))
    except OSError:  # another pool of this job holds the name: connect to it
        listener.close()
        return 0
    try:
        listener.listen(64)
        pid = os.fork()
        if pid == 0:
            try:
                if os.fork() == 0:
                    pool.serve_forked(job, listener)  # (never returns)
            finally:
                os._exit(0)
    finally:
        listener.close()
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:  # this process ignores SIGCHLD: the kernel reaped it
        return 0  # (the name was bound here first: the pool holds it, or a new one starts)
    return os.waitstatus_to_exitcode(status)


def connect(job: str):
    """(socket, pool pid) of a connection to the pool of `job`, started when there is none.
    ``wire.PeerRefused`` when the name is held by another user's process; EngineError when no
    pool answers."""
    addr = wire.address(job)
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    started_at = None
    status = None
    while True:
        sock = wire.new_socket()
        try:
            sock.connect(addr)
        except (ConnectionRefusedError, FileNotFoundError):
            sock.close()
            now = time.monotonic()
            if started_at is None or status is None or status < 0 \
                    or now - started_at > START_AGAIN_S:
                # none started yet, or the one started here was killed before it bound the
                # name, or no pool holds the name for a while (the one that held it died)
                status, started_at = _start_pool(job), time.monotonic()
                if status > 0:  # it failed on its own (its traceback is on stderr, above)
                    raise EngineError(
                        f"stoker: the node's worker pool for job {job!r} could not start: its "
                        f"process exited with status {status} (its traceback, if any, is above "
                        "on stderr)") from None
            if now > deadline:
                raise EngineError(f"stoker: the node's worker pool for job {job!r} did not "
                                  f"start within {CONNECT_TIMEOUT_S:.0f} s") from None
            time.sleep(0.02)
            continue
        except BaseException:
            sock.close()
            raise
        try:
            pid = wire.check_peer(sock, "the process serving the node pool's name")
        except BaseException:
            sock.close()
            raise
        return sock, pid
