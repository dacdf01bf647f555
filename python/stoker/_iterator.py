"""The multi-process iterator: torch's scheduling, stoker's transport and supervision.

Task scheduling mirrors torch's ``_MultiProcessingDataLoaderIter`` exactly (the same tasks go to
the same workers in the same order, so random augmentation drawn in workers matches torch batch
for batch). What differs: tasks and results travel on one SOCK_SEQPACKET channel per worker,
batches arrive as zero-copy views of shared-memory slots, and a worker's death is seen through a
pidfd in the same wait as the data, named, and, with the user's leave, survived: the worker is
restarted and exactly the tasks it had in flight are re-issued.
"""

from __future__ import annotations

import gc
import itertools
import logging
import os
import time
import warnings
import weakref

import torch
from torch.utils.data import IterableDataset
from torch.utils.data._utils.collate import default_collate, default_convert
from torch.utils.data.dataloader import _BaseDataLoaderIter

from . import _board, _cgroup, _fdpass, _protocol, _stoker, _worker
from ._errors import BatchEncodingError, CollateError, EngineError, SharedMemoryLimitError
from ._observation import Observation
from ._protocol import (
    MODE_AS_IS,
    MODE_COLLATE,
    MODE_CONVERT,
    MSG_BATCH,
    MSG_END,
    MSG_ERROR,
    MSG_RESUME,
    MSG_RESUMED,
    MSG_SKIPPED,
    MSG_TASK,
)
from ._supervision import _EXIT_GRACE_S, Supervision, _hashable_in
from ._supervision import Dropped as _Dropped

log = logging.getLogger("stoker")



class _End:
    """An iterable dataset ran out in this worker."""

    def __init__(self, worker_id):
        self.worker_id = worker_id


class _Failure:
    """An exception raised in a worker, to be re-raised in the main process."""

    def __init__(self, report: dict):
        self.report = report

    def reraise(self, slot_usage=dict):
        r = self.report
        exc_type = r["type"]
        if exc_type is SharedMemoryLimitError:
            from ._errors import shared_memory_limit_message

            raise exc_type(shared_memory_limit_message(r["message"], slot_usage()))
        if exc_type in (CollateError, BatchEncodingError):
            # stoker's own diagnosis of the data: the message already names index, field, type.
            raise exc_type(f"{r['message']}\n(in DataLoader worker process {r['worker_id']})")
        where = f"in DataLoader worker process {r['worker_id']}"
        if r["index"] is not None:
            where += f" while loading dataset index {_protocol.short_repr(r['index'])}"
        msg = f"Caught {r['type_name'].rsplit('.', 1)[-1]} {where}.\nOriginal {r['traceback']}"
        if exc_type is None:
            raise RuntimeError(msg + f"\n(the original type {r['type_name']} is not importable)")
        if exc_type is KeyError:
            raise KeyError(_KeyErrorMessage(msg))
        try:
            if getattr(exc_type, "message", None):  # as torch: types whose constructor wants it
                exc = exc_type(message=msg)
            else:
                exc = exc_type(msg)
        except Exception:
            raise RuntimeError(msg) from None
        raise exc


class _KeyErrorMessage(str):
    """KeyError repr()s its argument; this keeps the traceback readable."""

    def __repr__(self):
        return self


def _collate_mode(loader) -> int:
    if loader.collate_fn is default_collate:
        return MODE_COLLATE
    if loader.collate_fn is default_convert:
        return MODE_CONVERT
    return MODE_AS_IS


def _context(loader):
    ctx = loader.multiprocessing_context
    if ctx is None:
        ctx = torch.multiprocessing.get_context()
    if ctx.get_start_method() == "fork" and _cuda_initialized():
        warnings.warn(
            "stoker: CUDA is initialised in this process, and a forked worker cannot use it (it "
            "may hang or crash). Starting workers with 'forkserver' instead. To silence this, "
            "pass multiprocessing_context='forkserver' or 'spawn', or create the DataLoader "
            "before touching CUDA.",
            stacklevel=4,
        )
        ctx = torch.multiprocessing.get_context("forkserver")
    return ctx


def _cuda_initialized() -> bool:
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:
        return False


def _unpicklable_part(dataset) -> str | None:
    """Names the attribute of `dataset` that cannot be pickled (for spawn/forkserver)."""
    import pickle

    try:
        pickle.dumps(dataset)
        return None
    except Exception as e:
        top_error = e
    attrs = getattr(dataset, "__dict__", {})
    for name, value in attrs.items():
        try:
            pickle.dumps(value)
        except Exception as e:
            inner = _unpicklable_part(value) if hasattr(value, "__dict__") else None
            path = f"dataset.{name}"
            if inner:
                return inner.replace("dataset", path, 1)
            return f"{path} (a {type(value).__name__}: {e})"
    return f"the dataset itself (a {type(dataset).__name__}: {top_error})"


class MultiProcessIter(Supervision, Observation, _BaseDataLoaderIter):
    def __init__(self, loader) -> None:
        super().__init__(loader)
        if loader.prefetch_factor <= 0:
            raise AssertionError(
                "prefetch_factor must be greater than 0 for MultiProcessingDataLoaderIter"
            )
        self._prefetch_factor = loader.prefetch_factor
        self._in_order = loader.in_order
        self._worker_init_fn = loader.worker_init_fn
        self._collate_mode = _collate_mode(loader)
        self._kind = _worker.ITERABLE if isinstance(self._dataset, IterableDataset) else _worker.MAP
        self._state = loader._stoker_state
        self._opts = loader._stoker_options
        self._ctx = _context(loader)
        self._shutdown = False
        self._sup = _stoker.Supervisor()
        _fdpass.register_supervisor(self._sup)
        self._procs: list = [None] * self._num_workers
        self._leaving: set[int] = set()  # workers told to exit: their exit is no error
        self._hung: dict[int, tuple] = {}  # worker -> (index, seconds, stack) when we killed it
        self._last_hang_check = 0.0
        self._task_index: dict[int, object] = {}  # task -> what the sampler yielded, to re-issue
        self._oom_before = _cgroup.oom_kills()
        self._restarts_by_worker = [0] * self._num_workers
        self._state.iterator = weakref.ref(self)
        self._board = _board.Board(self._num_workers)
        self._start_workers()
        self._reset(loader, first_iter=True)

    # -- workers -------------------------------------------------------------------------------
    def _start_workers(self) -> None:
        forking = self._ctx.get_start_method() == "fork"
        if forking:
            gc.freeze()  # objects that exist now are not touched by a worker's GC: fewer COW pages
        try:
            for i in range(self._num_workers):
                self._start_worker(i)
        finally:
            if forking:
                gc.unfreeze()

    def _start_worker(self, worker_id: int) -> None:
        main_end, child_end = _stoker.channel_pair()
        _fdpass._pending.update((main_end, child_end))
        method = self._ctx.get_start_method()
        try:
            proc = self._ctx.Process(
                target=_worker.worker_main,
                args=(
                    _fdpass.ChannelFd(child_end),
                    worker_id,
                    self._num_workers,
                    self._kind,
                    self._dataset,
                    self._auto_collation,
                    self._collate_fn,
                    self._collate_mode,
                    self._drop_last,
                    self._base_seed,
                    self._worker_init_fn,
                    # The worker checks that its parent is still there; under forkserver its
                    # parent is the fork server, not this process (the channel covers us).
                    os.getpid() if method != "forkserver" else 0,
                    self._opts["on_error"],
                    self._opts["max_retries"],
                    self._board.token,
                    self._opts.get("max_shared_memory"),
                ),
                daemon=True,
            )
            try:
                proc.start()
            except Exception as e:
                if method != "fork":
                    culprit = _unpicklable_part(self._dataset)
                    if culprit:
                        raise type(e)(
                            f"{e}\nstoker: starting a worker with '{method}' pickles the "
                            f"dataset, and {culprit} cannot be pickled. Create it lazily in the "
                            "worker (in worker_init_fn or on first use in __getitem__), or use "
                            "multiprocessing_context='fork'."
                        ) from e
                raise
        except BaseException:
            _fdpass._pending.difference_update((main_end, child_end))
            os.close(main_end)
            os.close(child_end)
            raise
        _fdpass._pending.difference_update((main_end, child_end))
        os.close(child_end)
        self._sup.add_worker(worker_id, main_end, proc.pid)
        self._procs[worker_id] = proc

    def _stop_worker(self, worker_id: int) -> None:
        """Closes the worker's channel: its watchdog ends it at once."""
        self._leaving.add(worker_id)
        self._sup.remove_worker(worker_id)

    # -- epochs --------------------------------------------------------------------------------
    def _reset(self, loader, first_iter=False) -> None:
        super()._reset(loader, first_iter)
        self._state.epoch += 1
        self._restarts = 0
        self._yielded = 0
        self._waited_s = 0.0
        self._started_at = None  # when the loop first asked for a batch this epoch
        self._stall_noted = False
        self._board.set("epoch", self._state.epoch)
        self._board.set("batches_yielded", 0)
        self._board.set("waited_ns", 0)
        self._board.set("started_ns", 0)
        self._send_idx = 0
        self._rcvd_idx = 0
        self._task_info: dict = {}
        self._task_index = {}
        self._synthetic: list = []  # (task, result) made without a worker
        self._restarted_in_reset: set = set()  # workers restarted while a new epoch starts
        self._resetting = False
        self._tasks_outstanding = 0
        self._workers_status = [True] * self._num_workers
        self._workers_num_tasks = [0] * self._num_workers
        self._worker_queue_idx_cycle = itertools.cycle(range(self._num_workers))
        if not first_iter:
            # Persistent workers: a new epoch. Results of the old one still in flight are dropped.
            waiting = set()
            self._resetting = True
            for w in range(self._num_workers):
                if self._sup.has_worker(w):
                    try:
                        self._sup.send(w, MSG_RESUME, 0)
                    except EngineError:
                        pass  # it died between epochs: the wait below handles its death
                    waiting.add(w)
            while waiting:
                ev = self._wait()
                # A worker restarted meanwhile starts fresh: it is resumed already.
                waiting -= self._restarted_in_reset
                if ev is not None and ev[0] == "message" and ev[2] == MSG_RESUMED:
                    waiting.discard(ev[1])
            self._restarted_in_reset.clear()
            self._resetting = False
        for _ in range(self._prefetch_factor * self._num_workers):
            self._try_put_index()

    def _try_put_index(self) -> None:
        max_tasks = self._prefetch_factor * self._num_workers
        assert self._tasks_outstanding < max_tasks
        try:
            index = self._next_index()
        except StopIteration:
            return
        for _ in range(self._num_workers):  # the next active worker, as torch picks it
            worker_id = next(self._worker_queue_idx_cycle)
            if self._workers_status[worker_id]:
                if self._in_order:
                    break
                if self._workers_num_tasks[worker_id] < max_tasks // sum(self._workers_status):
                    break
        else:
            return
        task = self._send_idx
        self._task_info[task] = (worker_id,)
        self._workers_num_tasks[worker_id] += 1
        self._tasks_outstanding += 1
        self._send_idx += 1
        index = self._without_quarantined(task, index)
        self._task_index[task] = index
        if index is _Dropped:
            self._arrived(task, _Dropped())
            return
        self._send_task(worker_id, task, index)

    def _send_task(self, worker_id, task, index) -> None:
        fmt, payload = _protocol.encode_index(index)
        try:
            self._sup.send(worker_id, MSG_TASK, task, fmt, payload)
        except EngineError:
            pass  # the worker is gone: its death, with this task, is reported by the next wait

    def _without_quarantined(self, task, index):
        bad = self._state.quarantined
        if not bad or self._kind != _worker.MAP:
            return index
        if isinstance(index, list):
            kept = [i for i in index if not _hashable_in(i, bad)]
            if len(kept) == len(index):
                return index
            return kept if kept else _Dropped
        return _Dropped if _hashable_in(index, bad) else index

    # -- results -------------------------------------------------------------------------------
    def _arrived(self, task, data) -> None:
        """`task` has its result without a worker (every sample quarantined): it is delivered
        through the receive path like any other, so the bookkeeping stays in one place and a
        wait in progress returns instead of waiting for a message that will never come."""
        self._synthetic.append((task, data))

    def _get_data(self):
        t = time.monotonic()
        try:
            return self._receive()
        finally:
            waited = time.monotonic() - t
            self._waited_s += waited
            self._board.add("waited_ns", int(waited * 1e9))

    def _receive(self):
        while True:
            if self._synthetic:
                task, data = self._synthetic.pop(0)
                if task in self._task_info and len(self._task_info[task]) == 1:
                    return task, data
                continue
            ev = self._wait()
            if ev is None:  # a death produced a synthetic result: look again
                continue
            _, worker_id, mtype, task, a, b, c, payload, pending = ev
            live = task in self._task_info and len(self._task_info[task]) == 1
            if mtype == MSG_SKIPPED:
                if live:  # a re-issued task's first attempt already reported its skips
                    for index, reason in _protocol.decode_error(payload):
                        self._record_skip(index, reason)
                    if a == 1:
                        return task, _Dropped()
                continue
            if not live:
                if pending is not None:
                    pending.discard()  # a late duplicate (a re-issued task's first attempt)
                continue
            if mtype == MSG_BATCH:
                return task, pending
            if mtype == MSG_ERROR:
                return task, _Failure(_protocol.decode_error(payload))
            if mtype == MSG_END:
                return task, _End(worker_id)
            # anything else (a late RESUMED) is not a result

    def _next_data(self):
        while True:
            while self._rcvd_idx < self._send_idx:
                info = self._task_info.get(self._rcvd_idx)
                if info:
                    worker_id = info[0]
                    if len(info) == 2 or self._workers_status[worker_id]:
                        break
                    del self._task_info[self._rcvd_idx]
                self._rcvd_idx += 1
            else:
                if not self._persistent_workers:
                    self._shutdown_workers()
                raise StopIteration

            if len(self._task_info[self._rcvd_idx]) == 2:
                worker_id, data = self._task_info.pop(self._rcvd_idx)
                self._rcvd_idx += 1
                out = self._process_data(data, worker_id)
                if out is _Dropped:
                    continue
                return out

            assert not self._shutdown and self._tasks_outstanding > 0
            idx, data = self._get_data()
            self._tasks_outstanding -= 1
            self._task_index.pop(idx, None)
            if isinstance(data, _End):
                if self._persistent_workers:
                    self._workers_status[data.worker_id] = False
                else:
                    self._mark_worker_as_unavailable(data.worker_id)
                self._try_put_index()
                continue
            if idx != self._rcvd_idx:
                if not self._in_order:
                    worker_id = self._task_info.pop(idx)[0]
                    out = self._process_data(data, worker_id)
                    if out is _Dropped:
                        continue
                    return out
                self._task_info[idx] += (data,)
            else:
                worker_id = self._task_info.pop(idx)[0]
                self._rcvd_idx += 1
                out = self._process_data(data, worker_id)
                if out is _Dropped:
                    continue
                return out

    def _process_data(self, data, worker_id):
        self._workers_num_tasks[worker_id] -= 1
        self._try_put_index()
        if isinstance(data, _Dropped):
            return _Dropped
        if isinstance(data, _Failure):
            data.reraise(self._sup.slot_usage)
        batch = data.decode()
        if self._pin_memory:
            from torch.utils.data._utils.pin_memory import pin_memory

            batch = pin_memory(batch, self._pin_memory_device)
        return batch

    def _mark_worker_as_unavailable(self, worker_id, shutdown=False) -> None:
        self._workers_status[worker_id] = False
        self._stop_worker(worker_id)

    # -- shutdown ------------------------------------------------------------------------------
    def _shutdown_workers(self) -> None:
        if self._shutdown:
            return
        self._shutdown = True
        for key in list(self._task_info):
            info = self._task_info.pop(key)
            if len(info) == 2 and hasattr(info[1], "discard"):
                info[1].discard()
        for w in range(self._num_workers):
            self._sup.remove_worker(w)  # closing the channel ends the worker
        deadline = time.monotonic() + _EXIT_GRACE_S
        for proc in self._procs:
            if proc is not None:
                proc.join(timeout=max(0.0, deadline - time.monotonic()))
                if proc.is_alive():
                    proc.kill()
                    proc.join()
        self._procs = [None] * self._num_workers
        self._board.close()

    def __del__(self):
        try:
            self._shutdown_workers()
        except Exception:
            pass
