"""Clean exits and starts (tests/loader/iterators/test_lifecycle.py): low limits, many create/destroy
cycles, datasets spawn cannot send, CUDA before a fork, what a worker inherits."""

from __future__ import annotations

import gc
import os
import resource
import signal
import sys
import threading
import warnings

import torch

import stoker
from scenario_datasets import Slow, Squares
from scenarios import expect_raises
from scenarios.probes import labels, leftovers


class Holder(Squares):
    """A dataset subclass the user's script defines (a lock is set on it to make it unpicklable)."""


class PatchedIn(Squares):
    """A dataset class that exists only in this process: patched into a module at run time (see
    `_patched_in`), so a spawned worker importing that module does not find it."""


def _patched_in(cls: type, module: str) -> type:
    """`cls` set on `module` here only: pickled by that name (this process finds it there), and
    missing in a spawned worker, which imports `module` afresh."""
    cls.__module__ = module
    setattr(sys.modules[module], cls.__qualname__, cls)
    return cls


def _fds() -> int:
    """How many descriptors this process holds."""
    return len(os.listdir("/proc/self/fd"))


def _rss() -> int:
    """This process's resident memory, in bytes."""
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _maps() -> int:
    """How many mappings this process has."""
    return sum(1 for _ in open("/proc/self/maps"))


def low_fd_limit_with_held_batches():
    """Under a 128-descriptor limit, 100 batches held at once all arrive, using few descriptors."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))
    loader = stoker.DataLoader(Squares(400, shape=(1024,)), batch_size=4, num_workers=4)
    held = list(loader)
    assert len(held) == 100 and labels(held) == list(range(400))
    assert len(os.listdir("/proc/self/fd")) < 64


def create_iterate_destroy_cycles():
    """500 loaders created, iterated and dropped leak no descriptor, thread, mapping or memory.
    Forked workers: spawned ones (forkserver, 3.14's default) import torch each, ~2 s of CPU a
    worker, 1,000 of them here (tests/scenarios/errors.py and resources.py count what loaders
    leave under the default start method)."""
    ds = Squares(16, shape=(64, 64))

    def cycle():
        loader = stoker.DataLoader(ds, batch_size=4, num_workers=2,
                                   multiprocessing_context="fork")
        for _b in loader:
            pass

    for _ in range(10):
        cycle()
    gc.collect()
    start = (_fds(), threading.active_count(), _maps(), _rss())
    for _ in range(500):
        cycle()
    gc.collect()
    end = (_fds(), threading.active_count(), _maps(), _rss())
    assert end[:3] == start[:3], (start, end)
    assert end[3] - start[3] < 64 * 2**20, (start, end)
    assert not leftovers(), leftovers()
    print("FDS THREADS MAPS RSS", start, end)


def spawn_with_unpicklable_dataset():
    """A dataset spawn cannot pickle (it holds a lock) is refused naming the attribute."""
    ds = Holder(8)
    ds.lock = threading.Lock()
    with expect_raises(Exception) as raised:
        list(stoker.DataLoader(ds, batch_size=2, num_workers=1, multiprocessing_context="spawn"))
    msg = str(raised.value)
    assert "dataset.lock" in msg and "lock" in msg, msg


def fork_with_cuda_initialised():
    """fork asked for after CUDA is initialised becomes forkserver, with one warning saying why."""
    torch.cuda.is_initialized = lambda: True   # as after model.cuda() in a real job
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        it = iter(stoker.DataLoader(Squares(8), batch_size=2, num_workers=1,
                                    multiprocessing_context="fork"))
        assert labels(list(it)) == list(range(8))
    msgs = [str(x.message) for x in w if "forkserver" in str(x.message)]
    assert len(msgs) == 1 and "CUDA" in msgs[0], [str(x.message) for x in w]
    assert it.workers.start_method == "forkserver"


def workers_ignore_sigint_and_close_inherited_fds():
    """Workers ignore SIGINT and hold only their own channel end, no epoll, and the pidfd of
    the worker guard where it watches this process (fork, spawn; under forkserver, 3.14's
    default, the worker's parent is the fork server and the channel's end covers this one:
    worker.process.parent_pid_for)."""
    loader = stoker.DataLoader(Slow(64), batch_size=2, num_workers=2)
    it = iter(loader)
    next(it), next(it)  # (a batch from each worker: both have started)
    pidfds = 0 if it.workers.start_method == "forkserver" else 1
    mine = set(it.workers.owned_fds())  # noqa: F841
    for p in it._workers:
        status = open(f"/proc/{p.pid}/status").read()
        ign = int([line for line in status.splitlines()
                   if line.startswith("SigIgn")][0].split()[1], 16)
        assert ign & (1 << (signal.SIGINT - 1)), hex(ign)
        theirs = {os.readlink(f"/proc/{p.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{p.pid}/fd")}
        sockets = [t for t in theirs if t.startswith("socket:")]
        assert len(sockets) == 1, theirs           # its own channel end, nobody else's
        assert not any("eventpoll" in t for t in theirs), theirs
        # The worker guard's pidfd, of the main process (none of the supervisor's).
        assert sum("pidfd" in t for t in theirs) == pidfds, (it.workers.start_method, theirs)


def worker_that_cannot_start():
    """A spawned worker that cannot unpickle its dataset's class is reported as failing to
    start, naming what it could not find."""
    cls = _patched_in(PatchedIn, "scenario_datasets")  # the worker's module has no such class
    with expect_raises(stoker.WorkerCrashed) as raised:
        list(stoker.DataLoader(cls(8), batch_size=2, num_workers=2,
                               multiprocessing_context="spawn"))
    msg = str(raised.value)
    assert "while starting" in msg and "patched in at run time" in msg, msg
