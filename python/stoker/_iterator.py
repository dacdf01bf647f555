"""The multi-process iterator: torch's scheduling, stoker's transport and supervision.

Task scheduling mirrors torch's ``_MultiProcessingDataLoaderIter`` exactly (the same tasks go to
the same workers in the same order, so random augmentation drawn in workers matches torch batch
for batch). What differs: tasks and results travel on one SOCK_SEQPACKET channel per worker,
batches arrive as zero-copy views of shared-memory slots, and a death is seen through a pidfd
in the same wait as the data, named, and reported with the indices it was loading.
"""

from __future__ import annotations

import gc
import itertools
import os
import warnings

import torch
from torch.utils.data import IterableDataset
from torch.utils.data._utils.collate import default_collate, default_convert
from torch.utils.data.dataloader import _BaseDataLoaderIter

from . import _deaths, _fdpass, _protocol, _stoker, _worker
from ._errors import EngineError, WorkerCrashed
from ._protocol import (
    MODE_AS_IS,
    MODE_COLLATE,
    MODE_CONVERT,
    MSG_BATCH,
    MSG_END,
    MSG_ERROR,
    MSG_RESUME,
    MSG_RESUMED,
    MSG_TASK,
)

# How long shutdown waits for workers to leave by themselves before SIGKILL.
_EXIT_GRACE_S = 1.0


class _End:
    """An iterable dataset ran out in this worker."""

    def __init__(self, worker_id):
        self.worker_id = worker_id


class _Failure:
    """An exception raised in a worker, to be re-raised in the main process."""

    def __init__(self, report: dict):
        self.report = report

    def reraise(self):
        r = self.report
        where = f"in DataLoader worker process {r['worker_id']}"
        if r["index"] is not None:
            where += f" while loading dataset index {_protocol.short_repr(r['index'])}"
        msg = f"Caught {r['type_name'].rsplit('.', 1)[-1]} {where}.\nOriginal {r['traceback']}"
        exc_type = r["type"]
        if exc_type is None:
            raise RuntimeError(msg + f"\n(the original type {r['type_name']} is not importable)")
        if exc_type is KeyError:
            raise KeyError(_KeyErrorMessage(msg))
        try:
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


class MultiProcessIter(_BaseDataLoaderIter):
    def __init__(self, loader) -> None:
        super().__init__(loader)
        if self._num_workers <= 0:
            raise AssertionError("num_workers must be greater than 0 for MultiProcessingDataLoaderIter")
        if loader.prefetch_factor <= 0:
            raise AssertionError(
                "prefetch_factor must be greater than 0 for MultiProcessingDataLoaderIter"
            )
        self._prefetch_factor = loader.prefetch_factor
        self._in_order = loader.in_order
        self._worker_init_fn = loader.worker_init_fn
        self._collate_mode = _collate_mode(loader)
        self._kind = (
            _worker.ITERABLE if isinstance(self._dataset, IterableDataset) else _worker.MAP
        )
        self._ctx = _context(loader)
        self._shutdown = False
        self._sup = _stoker.Supervisor()
        _fdpass.register_supervisor(self._sup)
        self._procs: list = [None] * self._num_workers
        self._leaving: set[int] = set()  # workers told to exit: their exit is no error
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
                    os.getpid() if self._ctx.get_start_method() != "forkserver" else 0,
                ),
                daemon=True,
            )
            proc.start()
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
        self._send_idx = 0
        self._rcvd_idx = 0
        self._task_info: dict = {}
        self._tasks_outstanding = 0
        self._workers_status = [True] * self._num_workers
        self._workers_num_tasks = [0] * self._num_workers
        self._worker_queue_idx_cycle = itertools.cycle(range(self._num_workers))
        if not first_iter:
            # Persistent workers: a new epoch. Results of the old one still in flight are dropped.
            waiting = set()
            for w in range(self._num_workers):
                if self._sup.has_worker(w):
                    self._sup.send(w, MSG_RESUME, 0)
                    waiting.add(w)
            while waiting:
                ev = self._wait()
                if ev[0] == "message" and ev[2] == MSG_RESUMED:
                    waiting.discard(ev[1])
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
        fmt, payload = _protocol.encode_index(index)
        try:
            self._sup.send(worker_id, MSG_TASK, self._send_idx, fmt, payload)
        except EngineError:
            pass  # the worker is gone: its death, with this task, is reported by the next wait
        self._task_info[self._send_idx] = (worker_id,)
        self._workers_num_tasks[worker_id] += 1
        self._tasks_outstanding += 1
        self._send_idx += 1

    # -- results -------------------------------------------------------------------------------
    def _wait(self):
        timeout = self._timeout if self._timeout > 0 else None
        while True:
            ev = self._sup.wait(timeout)
            if ev is None:
                raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds")
            if ev[0] == "died":
                self._on_death(ev)
                continue
            return ev

    def _on_death(self, ev) -> None:
        _, worker_id, exit_code, signum, core = ev
        proc = self._procs[worker_id]
        self._sup.remove_worker(worker_id)
        if worker_id in self._leaving:
            self._leaving.discard(worker_id)
            if proc is not None:
                proc.join(timeout=_EXIT_GRACE_S)
            return
        if proc is not None:
            proc.join(timeout=_EXIT_GRACE_S)
        indices = [
            i for i, info in self._task_info.items() if len(info) == 1 and info[0] == worker_id
        ]
        pid = proc.pid if proc is not None else None
        how = _deaths.describe_exit(exit_code, signum, core)
        self._shutdown_workers()
        raise WorkerCrashed(
            f"DataLoader worker {worker_id} (pid {pid}) {how} while it had "
            f"{len(indices)} batch(es) in flight.",
            worker_id=worker_id,
            pid=pid,
            signal=_deaths.signal_name(signum) if signum else None,
            exit_code=None if signum else exit_code,
            cause=how,
            indices=indices,
        )

    def _get_data(self):
        while True:
            ev = self._wait()
            _, worker_id, mtype, task, a, b, c, payload, pending = ev
            if mtype == MSG_BATCH:
                return task, pending
            if mtype == MSG_ERROR:
                return task, _Failure(_protocol.decode_error(payload))
            if mtype == MSG_END:
                return task, _End(worker_id)
            # anything else (late RESUMED) is not a result

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
                return self._process_data(data, worker_id)

            assert not self._shutdown and self._tasks_outstanding > 0
            idx, data = self._get_data()
            self._tasks_outstanding -= 1
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
                    return self._process_data(data, worker_id)
                self._task_info[idx] += (data,)
            else:
                worker_id = self._task_info.pop(idx)[0]
                self._rcvd_idx += 1
                return self._process_data(data, worker_id)

    def _process_data(self, data, worker_id):
        self._workers_num_tasks[worker_id] -= 1
        self._try_put_index()
        if isinstance(data, _Failure):
            data.reraise()
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
        for proc in self._procs:
            if proc is not None:
                proc.join(timeout=_EXIT_GRACE_S)
                if proc.is_alive():
                    proc.kill()
                    proc.join()
        self._procs = [None] * self._num_workers

    def __del__(self):
        try:
            self._shutdown_workers()
        except Exception:
            pass
