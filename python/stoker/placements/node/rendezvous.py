"""Finding the node's pool: which job this process belongs to, and a connection to the pool of
that job and user, started here when there is none yet.

The first rank that needs the pool starts it (``python -m stoker.placements.node.pool``, which
detaches at once: it is nobody's child and outlives no one, docs/design/node.md), with a
template of itself for the pool's workers to be forked from (template.py: not when this rank
has CUDA initialised or other Python threads running); every rank then connects. Two ranks starting it at once is harmless: the name is bound by one pool only
(the other sees ``EADDRINUSE`` and leaves), and both ranks connect to the one that bound it.

Runs on the thread that starts an iterator's workers.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from ..._errors import EngineError
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
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    env["STOKER_NODE_POOL"] = "1"  # stoker's import leaves torch out of the pool (__init__.py)
    # The pool's workers are forked from a template of this rank (template.py), made before the
    # pool and handed to it: its end of their link passes as an inherited descriptor.
    pool_end = None
    if template.can_fork() and not _other_threads():
        pool_end, template_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            template.fork_template(template_end.fileno())
        finally:
            template_end.close()
    args = [sys.executable, "-m", "stoker.placements.node.pool", job]
    if pool_end is not None:
        args.append(str(pool_end.fileno()))
    # It detaches (forks and its first process exits): waiting here reaps that first process.
    # Its stdout and stderr are this rank's: what a dataset prints in a pool worker shows there.
    # Its status: 0 once it has bound the name and detached (or found it held); negative: killed
    # by that signal before; positive: it failed (an import error, say).
    try:
        return subprocess.run(args, env=env, stdin=subprocess.DEVNULL, start_new_session=True,
                              pass_fds=() if pool_end is None else (pool_end.fileno(),),
                              check=False, timeout=CONNECT_TIMEOUT_S).returncode
    except subprocess.TimeoutExpired:
        return -1
    finally:
        if pool_end is not None:
            pool_end.close()  # (the pool has its copy; a pool that left closes it: so does
            #                   the template, on its link's end)


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
