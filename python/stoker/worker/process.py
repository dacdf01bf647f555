"""A local worker process: set up its end of the engine, then run the worker loop.

The local placement starts ``worker_main`` with multiprocessing's context (fork, spawn or
forkserver). Before the loop (``worker.py``) runs, the process makes itself a good worker:

- ``gc.freeze()`` in the child, so its collector does not copy the parent's objects page by page
  (the parent's own freeze state is never touched). On a free-threaded build the freeze itself
  writes a bit into every object, so a forked worker copies those pages once (~50 MB with torch
  imported, measured on 3.14t), as its first collection would anyway;
- SIGINT ignored (Ctrl+C reaches the whole process group; the main process decides);
- every inherited engine descriptor that is not its own closed (``fdpass``), so a sibling cannot
  hide the main process's death;
- the C++ ``WorkerEndpoint`` on its channel, with its share of ``max_shared_memory`` and a guard
  that ends the process when the main process goes;
- faulthandler writing into a memfd the main process reads after a crash (and on
  ``DUMP_SIGNAL``, the stack of a hang), and a copy of stderr's last lines;
- its status page, named with the loader's token (``stoker top`` and the hang watch read it).

Runs in the worker process, on its main thread.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import gc
import os
import select
import signal
import sys

from .. import _stoker
from ..common import gil as _gil
from ..common import system as _system
from ..common.errors import EngineError
from ..pickling.by_value import Carried
from ..wire import fdpass, protocol
from ..wire.sealed import Opened
from . import loop as _loop
from .loop import WorkerConfig, WorkerLoop

# faulthandler dumps every thread's stack on this signal: the main process asks for it when a
# worker hangs. A real-time signal, so it does not collide with SIGUSR1/2 users of the dataset.
DUMP_SIGNAL = signal.SIGRTMIN + 2
_STDERR_KEEP = 256 * 1024


def parent_pid_for(start_method: str) -> int:
    """The pid a worker checks its parent against: this process under fork and spawn; 0 where
    its parent is another process (a fork server, the node pool's template): the channel's EOF
    covers this process there."""
    return os.getpid() if start_method in ("fork", "spawn") else 0


def _main_gone(fd: int) -> bool:
    """True when the main process closed its end of the channel (it ended the iterator)."""
    p = select.poll()
    p.register(fd, select.POLLRDHUP)
    return any(ev & (select.POLLRDHUP | select.POLLHUP | select.POLLERR) for _, ev in p.poll(0))


class _TeeStderr:
    """sys.stderr that also keeps the last lines in a memfd the main process can read after a
    death ("exited with code 1: its last lines on stderr were ...")."""

    def __init__(self, stream, fd):
        self._stream = stream
        self._fd = fd
        self._size = 0

    def write(self, text):
        n = self._stream.write(text)
        try:
            data = text.encode("utf-8", "replace")
            if self._size + len(data) > _STDERR_KEEP:
                os.ftruncate(self._fd, 0)
                os.lseek(self._fd, 0, os.SEEK_SET)
                self._size = 0
            os.write(self._fd, data)
            self._size += len(data)
        except OSError:
            pass
        return n

    def flush(self):
        self._stream.flush()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _share_logs(endpoint) -> None:
    crash = os.memfd_create("stoker-crash-log", os.MFD_CLOEXEC)
    faulthandler.enable(file=crash, all_threads=True)
    faulthandler.register(DUMP_SIGNAL, file=crash, all_threads=True, chain=False)
    endpoint.send_fd(protocol.MSG_LOG_FILE, protocol.LOG_CRASH, crash)
    tee = os.memfd_create("stoker-stderr", os.MFD_CLOEXEC)
    endpoint.send_fd(protocol.MSG_LOG_FILE, protocol.LOG_STDERR, tee)
    sys.stderr = _TeeStderr(sys.stderr, tee)


def _use_stdio(stdio) -> None:
    """Standard output and error onto `stdio` (two ChannelFd: the rank's a pool worker loads
    for), flushing what was written before."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    for target, passed in zip((1, 2), stdio):
        os.dup2(passed.fd, target)
        os.close(passed.fd)
    # Line-buffered: each line one write(2), whole beside the lines of the rank's other workers
    # sharing the pipe (the pool's own streams write through: a print's text and its newline
    # would be two writes, and two workers' lines could meet on one line).
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False, errors="backslashreplace")
    for stream in ("stdout", "stderr"):  # (faulthandler and others use these)
        setattr(sys, f"__{stream}__", getattr(sys, stream))


_for_another = False  # a worker started for another process than its parent (node pool)


def started_for_another() -> bool:
    """This process is a worker the node's pool started for a rank (its script's top level
    may be running here, imported for the dataset's classes)."""
    return _for_another


def worker_main(channel: fdpass.ChannelFd, worker_id: int, config: WorkerConfig,
                parent_pid: int, loader_token: int, sealed: Opened | Carried | None = None) -> None:
    """The process's target. `parent_pid`: the process whose exit ends this one (0: only the
    channel's EOF); `loader_token`: names the status page after the loader's board; `sealed`
    (spawn and forkserver): what holds the dataset, collate_fn and worker_init_fn that `config`
    then lacks (the sealed memfd, or a ``pickling.by_value.Carried`` pickled for this worker alone)."""
    # SIGINT first: the freeze walks every object on a free-threaded build, long enough for a
    # Ctrl+C to the process group to land in it
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    gc.freeze()
    fd = channel.fd
    if config.stdio is not None:  # (before the stderr tee: it writes to fd 2 too)
        _use_stdio(config.stdio)
    fdpass.close_inherited(keep=fd)
    endpoint = _stoker.WorkerEndpoint(fd, worker_id)
    if config.shared_memory_share:
        endpoint.set_shared_memory_limit(config.shared_memory_share,
                                         _loop.SHARED_MEMORY_PATIENCE_S)
    endpoint.arm_guard(parent_pid)
    try:
        # The crash log first: once the main process sees a status page, it may ask for a
        # stack (DUMP_SIGNAL), which faulthandler must be ready to answer.
        _share_logs(endpoint)
        if config.prepare is not None:  # started for another process (the node pool)
            import multiprocessing.spawn

            global _for_another
            _for_another = True
            multiprocessing.spawn.prepare(config.prepare)
        if sealed is not None:
            # Before the status page: a dataset that cannot be unpickled here is a worker that
            # died while starting, with its traceback on stderr.
            dataset, collate_fn, init_fn = sealed.load()
            config = dataclasses.replace(config, dataset=dataset, collate_fn=collate_fn,
                                         init_fn=init_fn)
            gc.freeze()  # the dataset's objects too: the collector never writes their pages
        endpoint.open_status(loader_token)
    except EngineError:
        if _main_gone(fd):
            return  # the iterator was dropped while this worker started
        raise
    loop = WorkerLoop(endpoint, worker_id, config)
    loop.prepare()
    # On a free-threaded Python: a module the dataset imported here turned the GIL on (the
    # warning goes to the worker's stderr, which the main process shows).
    _gil.warn_in_worker()
    endpoint.mark_ready(*_system.spent_so_far())
    try:
        loop.serve()
    except EngineError:
        if not _main_gone(fd):
            raise
        # The main process ended the iterator (an epoch dropped mid-way, `del loader`): nothing
        # to report and nobody to report it to.
    endpoint.enter(protocol.STATE_IDLE, loop.task, None)
    # Returning (not os._exit) lets multiprocessing flush stdout/stderr and run its exit
    # cleanup in this process, as torch's workers do.
