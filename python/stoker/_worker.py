"""The worker process: receive a task, load the samples, encode the batch into a slot.

Runs the user's dataset exactly as torch's worker loop does (same seeding, worker info, fetch
and collate semantics); what differs is the transport (batches are written by the C++ encoder
into reusable shared-memory slots instead of being pickled through a queue) and what the worker
tells the main process: a status page naming the sample it is on, faulthandler's stack on a
fatal signal or on request, and a copy of its stderr.
"""

from __future__ import annotations

import faulthandler
import gc
import operator
import os
import pickle
import random
import signal
import sys

from . import _collate, _fdpass, _iter_state, _protocol, _stoker
from ._errors import EngineError, SharedMemoryLimitError
from ._fetch import ITERABLE, MAP, Dropped, Fetcher  # noqa: F401  (MAP re-exported)
from ._protocol import (
    MODE_AS_IS,
    MODE_COLLATE,
    MODE_CONVERT,
    MSG_END,
    MSG_ERROR,
    MSG_ITER_STATE,
    MSG_RESUME,
    MSG_RESUMED,
    MSG_SKIPPED,
    MSG_STOP,
    MSG_TASK,
)

# faulthandler dumps every thread's stack on this signal: the main process asks for it when a
# worker hangs. A real-time signal, so it does not collide with SIGUSR1/2 users of the dataset.
DUMP_SIGNAL = signal.SIGRTMIN + 2
# How long a batch waits for the user to let go of shared memory under max_shared_memory before
# it fails with SharedMemoryLimitError; each slot that comes free starts the wait afresh.
SHARED_MEMORY_PATIENCE_S = 30.0
_STDERR_KEEP = 256 * 1024


def parent_pid_for(start_method: str) -> int:
    """The pid a worker checks its parent against: this process, except under forkserver, where
    the parent is the fork server (the channel's EOF covers this process there)."""
    return os.getpid() if start_method != "forkserver" else 0


def _seed(base_seed: int, worker_id: int) -> int:
    """Seeds random, torch and NumPy as torch's worker does; returns the worker's seed."""
    seed = base_seed + worker_id
    random.seed(seed)
    try:
        import torch

        torch.manual_seed(seed)
    except ImportError:
        return seed
    try:
        import numpy as np

        from ._torch_compat import numpy_seed

        np.random.seed(numpy_seed(base_seed, worker_id))
    except ImportError:
        pass
    return seed


def _status_index(index):
    """`index` as an int for the status page when it is one (int, NumPy or 0-d tensor ints),
    else None."""
    if type(index) is int:
        return index
    try:
        return operator.index(index)
    except TypeError:
        return None


def _main_gone(fd: int) -> bool:
    """True when the main process closed its end of the channel (it ended the iterator)."""
    import select

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
    endpoint.send_fd(_protocol.MSG_LOG_FILE, _protocol.LOG_CRASH, crash)
    tee = os.memfd_create("stoker-stderr", os.MFD_CLOEXEC)
    endpoint.send_fd(_protocol.MSG_LOG_FILE, _protocol.LOG_STDERR, tee)
    sys.stderr = _TeeStderr(sys.stderr, tee)


def worker_main(
    channel: _fdpass.ChannelFd,
    worker_id: int,
    num_workers: int,
    kind: int,
    dataset,
    auto_collation: bool,
    collate_fn,
    collate_mode: int,
    drop_last: bool,
    base_seed: int,
    init_fn,
    parent_pid: int,
    on_error: str = "raise",
    max_retries: int = 3,
    loader_token: int = 0,
    max_shared_memory: int | None = None,
    shared_seed: int | None = None,
    seeder=None,
    iter_states=None,
) -> None:
    # Objects inherited from the parent are left alone by this worker's garbage collector: their
    # pages stay shared instead of being copied by the collector's writes (copy-on-read). Done
    # here, in the child, so the parent's own gc.freeze() state is never touched.
    gc.freeze()
    # Ctrl+C reaches the whole process group; the main process decides what happens.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    fd = channel.fd
    _fdpass.close_inherited(keep=fd)
    endpoint = _stoker.WorkerEndpoint(fd, worker_id)
    if max_shared_memory:  # divided among the workers
        share = max(1, max_shared_memory // max(1, num_workers))
        endpoint.set_shared_memory_limit(share, SHARED_MEMORY_PATIENCE_S)
    endpoint.arm_guard(parent_pid)
    try:
        # The crash log first: once the main process sees a status page, it may ask for a
        # stack (DUMP_SIGNAL), which faulthandler must be ready to answer.
        _share_logs(endpoint)
        endpoint.open_status(loader_token)
    except EngineError:
        if _main_gone(fd):
            return  # the iterator was dropped while this worker started
        raise

    if "torch" in sys.modules or collate_mode != MODE_AS_IS:
        try:
            import torch

            torch.set_num_threads(1)
            _collate.stop_collate_from_using_shm()
        except ImportError:
            pass
    if "cv2" in sys.modules:
        try:
            sys.modules["cv2"].setNumThreads(0)
        except Exception:
            pass
    seed = _seed(base_seed, worker_id)
    if shared_seed is not None:  # an IterDataPipe: one shuffle order for all workers
        from ._torch_compat import with_shared_seed

        dataset = with_shared_seed(dataset, shared_seed)
    from . import _info

    _info.set_worker_info(worker_id, num_workers, seed, dataset)

    task_box = [0]

    def on_sample(index, position):
        endpoint.enter(_protocol.STATE_FETCHING, task_box[0], _status_index(index),
                       -1 if position is None else position)
        endpoint.add_sample()
        if seeder is not None:  # seed="per_sample": _seeding.py
            seeder(index)

    def new_fetcher(restore=None):
        # A resumed stateful IterableDataset (_iter_state.py): this worker's saved state back.
        mine = restore.get(worker_id) if restore and kind == ITERABLE else None
        _iter_state.restore_dataset(dataset, mine)
        f = Fetcher(kind, dataset, auto_collation, drop_last, on_error, max_retries, on_sample)
        if kind == ITERABLE:
            _iter_state.restore_iterator(f.iterator, mine)
        return f

    def send_iter_state(task) -> bool:
        """False when the state could not be taken (the task's outcome is then that error:
        a batch whose state is lost could not be resumed after)."""
        if kind != ITERABLE:
            return True
        try:
            state = _iter_state.capture(dataset, fetcher.iterator)
        except Exception as e:
            err = RuntimeError(
                f"stoker: the IterableDataset's state_dict() failed in worker {worker_id} "
                f"({type(e).__name__}: {_protocol.safe_str(e)}). stoker takes it after every "
                "batch so that a checkpoint can resume each worker's stream; make state_dict() "
                "return a picklable dict, or remove state_dict/load_state_dict from the "
                "dataset (resume then re-reads and drops the batches already received).")
            err.__cause__ = e
            endpoint.send(MSG_ERROR, task, 0, _error(err, worker_id, fetcher))
            return False
        if state is not None:  # before the task's outcome: the main process pairs them
            endpoint.send(MSG_ITER_STATE, task, 0, state)
        return True

    init_error = None
    fetcher = None
    try:
        if init_fn is not None:
            init_fn(worker_id)
        fetcher = new_fetcher(iter_states.states if iter_states is not None else None)
    except Exception as e:  # reported with the first task, as torch does
        init_error = e

    def serve():
        nonlocal init_error, fetcher, dataset
        ended = False
        while True:
            endpoint.enter(_protocol.STATE_IDLE, task_box[0], None)
            msg = endpoint.receive()
            if msg is None:
                break
            mtype, task, fmt, payload = msg
            if mtype == MSG_STOP:
                break
            if mtype == MSG_RESUME:
                # A new epoch may take a while (iter() of a stream, a restored state): "starting"
                # tells the main process this worker has taken its message and is busy with it.
                endpoint.enter(_stoker.STATE_STARTING, task_box[0], None)
                ended = False
                base_seed, shared, restore = _protocol.decode_resume(payload)
                if shared is not None:  # an IterDataPipe: the new epoch's shuffle order
                    from ._torch_compat import with_shared_seed

                    dataset = with_shared_seed(dataset, shared)
                if seeder is not None:  # per-sample seeding: the new epoch and base seed
                    seeder.epoch = task
                    seeder.base_seed = base_seed
                if init_error is None:
                    try:
                        fetcher = new_fetcher(restore)
                    except Exception as e:
                        init_error = e
                endpoint.send(MSG_RESUMED, task)
                continue
            if mtype != MSG_TASK or ended:
                continue
            task_box[0] = task
            index = _protocol.decode_index(fmt, payload)
            if init_error is not None:
                endpoint.send(MSG_ERROR, task, 0, _protocol.encode_error(init_error, worker_id, None))
                init_error = None
                continue
            try:
                data = fetcher.fetch(index)
            except StopIteration:
                if kind == ITERABLE:
                    ended = True
                    _report_skipped(endpoint, task, fetcher, dropped=False)
                    endpoint.send(MSG_END, task)
                    continue
                endpoint.send(MSG_ERROR, task, 0, _error(StopIteration(), worker_id, fetcher))
                continue
            except Dropped:
                if send_iter_state(task):
                    _report_skipped(endpoint, task, fetcher, dropped=True)
                continue
            except Exception as e:
                try:  # the user gets this error: the stream continues after it on resume
                    state = _iter_state.capture(dataset, fetcher.iterator) if kind == ITERABLE \
                        else None
                except Exception:
                    state = None
                if state is not None:
                    endpoint.send(MSG_ITER_STATE, task, 0, state)
                endpoint.send(MSG_ERROR, task, 0, _error(e, worker_id, fetcher))
                continue
            if not send_iter_state(task):
                continue
            _report_skipped(endpoint, task, fetcher, dropped=False)
            try:
                _send(endpoint, task, data, collate_fn, collate_mode, index if kind == MAP else None)
            except Exception as e:
                fetcher.current = index if kind == MAP else None
                if on_error == "skip" and not isinstance(e, SharedMemoryLimitError):
                    fetcher.skipped = [(i, f"collate failed: {type(e).__name__}: "
                                           f"{_protocol.safe_str(e)}")
                                       for i in (index if isinstance(index, list) else [index])]
                    _report_skipped(endpoint, task, fetcher, dropped=True)
                else:
                    endpoint.send(MSG_ERROR, task, 0, _error(e, worker_id, fetcher))
            del data
            endpoint.update_rss()

    try:
        serve()
    except EngineError:
        if not _main_gone(fd):
            raise
        # The main process ended the iterator (an epoch dropped mid-way, `del loader`): nothing
        # to report and nobody to report it to.
    endpoint.enter(_protocol.STATE_IDLE, task_box[0], None)
    # Returning (not os._exit) lets multiprocessing flush stdout/stderr and run its exit
    # cleanup in this process, as torch's workers do.


def _report_skipped(endpoint, task, fetcher, dropped: bool) -> None:
    if fetcher.skipped or dropped:
        payload = pickle.dumps([(i, r) for i, r in fetcher.skipped])
        endpoint.send(MSG_SKIPPED, task, 1 if dropped else 0, payload)
        fetcher.skipped = []


def _error(exc, worker_id, fetcher) -> bytes:
    index = fetcher.current if fetcher is not None else None
    return _protocol.encode_error(exc, worker_id, index)


def _send(endpoint, task, data, collate_fn, mode, index) -> None:
    indices = index if isinstance(index, list) else None
    if mode == MODE_AS_IS:
        endpoint.enter(_protocol.STATE_COLLATING, task, None)
        out = collate_fn(data)
        endpoint.enter(_protocol.STATE_ENCODING, task, None)
        endpoint.send_batch(task, out, MODE_AS_IS, indices)
        return
    endpoint.enter(_protocol.STATE_ENCODING, task, None)
    if endpoint.send_batch(task, data, mode, indices):
        return
    # The fast path declined (an unusual type): torch's own collate decides, in Python.
    endpoint.enter(_protocol.STATE_COLLATING, task, None)
    if mode == MODE_COLLATE:
        out = _collate.collate_in_python(data)
    else:
        assert mode == MODE_CONVERT
        out = _collate.convert_in_python(data)
    endpoint.enter(_protocol.STATE_ENCODING, task, None)
    endpoint.send_batch(task, out, MODE_AS_IS, indices)
