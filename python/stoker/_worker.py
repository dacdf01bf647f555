"""The worker process: receive a task, load the samples, encode the batch into a slot.

Runs the user's dataset exactly as torch's worker loop does (same seeding, worker info, fetch
and collate semantics); what differs is the transport: batches are written by the C++ encoder
into reusable shared-memory slots instead of being pickled through a queue.
"""

from __future__ import annotations

import os
import random
import signal
import sys

from . import _collate, _fdpass, _protocol, _stoker
from ._protocol import (
    MODE_AS_IS,
    MODE_COLLATE,
    MODE_CONVERT,
    MSG_END,
    MSG_ERROR,
    MSG_RESUME,
    MSG_RESUMED,
    MSG_STOP,
    MSG_TASK,
)

MAP, ITERABLE = 0, 1


def _seed(base_seed: int, worker_id: int) -> int:
    """Seeds random, torch and NumPy as torch's worker does; returns the worker's seed."""
    seed = base_seed + worker_id
    random.seed(seed)
    try:
        import torch

        torch.manual_seed(seed)
        from torch.utils.data._utils.worker import _generate_state
    except ImportError:
        _generate_state = None
    try:
        import numpy as np

        if _generate_state is not None:
            np.random.seed(_generate_state(base_seed, worker_id))
    except ImportError:
        pass
    return seed


def _set_worker_info(worker_id, num_workers, seed, dataset) -> None:
    from . import _info

    _info.set_worker_info(worker_id, num_workers, seed, dataset)


class _Fetcher:
    """torch's fetch semantics: map-style by index, iterable-style from the worker's iterator."""

    def __init__(self, kind, dataset, auto_collation, drop_last):
        self.kind = kind
        self.dataset = dataset
        self.auto_collation = auto_collation
        self.drop_last = drop_last
        self.current = None  # the index being loaded, for error reports
        if kind == ITERABLE:
            self.iterator = iter(dataset)
            self.ended = False

    def fetch(self, index):
        if self.kind == MAP:
            if not self.auto_collation:
                self.current = index
                return self.dataset[index]
            getitems = getattr(self.dataset, "__getitems__", None)
            if getitems:
                self.current = index
                return getitems(index)
            data = []
            for i in index:
                self.current = i
                data.append(self.dataset[i])
            self.current = index
            return data
        if self.ended:
            raise StopIteration
        if not self.auto_collation:
            return next(self.iterator)
        data = []
        for _ in index:
            try:
                data.append(next(self.iterator))
            except StopIteration:
                self.ended = True
                break
        if len(data) == 0 or (self.drop_last and len(data) < len(index)):
            raise StopIteration
        return data


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
) -> None:
    # Ctrl+C reaches the whole process group; the main process decides what happens.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    fd = channel.fd
    _fdpass.close_inherited(keep=fd)
    endpoint = _stoker.WorkerEndpoint(fd, worker_id)
    endpoint.arm_guard(parent_pid)

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
    _set_worker_info(worker_id, num_workers, seed, dataset)

    init_error = None
    fetcher = None
    try:
        if init_fn is not None:
            init_fn(worker_id)
        fetcher = _Fetcher(kind, dataset, auto_collation, drop_last)
    except Exception as e:  # reported with the first task, as torch does
        init_error = e

    ended = False
    while True:
        msg = endpoint.receive()
        if msg is None:
            break
        mtype, task, fmt, payload = msg
        if mtype == MSG_STOP:
            break
        if mtype == MSG_RESUME:
            ended = False
            if init_error is None:
                try:
                    fetcher = _Fetcher(kind, dataset, auto_collation, drop_last)
                except Exception as e:
                    init_error = e
            endpoint.send(MSG_RESUMED, task)
            continue
        if mtype != MSG_TASK or ended:
            continue
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
                endpoint.send(MSG_END, task)
                continue
            endpoint.send(MSG_ERROR, task, 0, _error(StopIteration(), worker_id, fetcher))
            continue
        except Exception as e:
            endpoint.send(MSG_ERROR, task, 0, _error(e, worker_id, fetcher))
            continue
        try:
            _send(endpoint, task, data, collate_fn, collate_mode, index if kind == MAP else None)
        except Exception as e:
            fetcher.current = index if kind == MAP else None
            endpoint.send(MSG_ERROR, task, 0, _error(e, worker_id, fetcher))
        del data
    os._exit(0)


def _error(exc, worker_id, fetcher) -> bytes:
    index = fetcher.current if fetcher is not None else None
    return _protocol.encode_error(exc, worker_id, index)


def _send(endpoint, task, data, collate_fn, mode, index) -> None:
    indices = index if isinstance(index, list) else None
    if mode == MODE_AS_IS:
        endpoint.send_batch(task, collate_fn(data), MODE_AS_IS, indices)
        return
    if endpoint.send_batch(task, data, mode, indices):
        return
    # The fast path declined (an unusual type): torch's own collate decides, in Python.
    if mode == MODE_COLLATE:
        out = _collate.collate_in_python(data)
    else:
        assert mode == MODE_CONVERT
        out = _collate.convert_in_python(data)
    endpoint.send_batch(task, out, MODE_AS_IS, indices)
