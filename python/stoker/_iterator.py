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
import signal
import time
import warnings
import weakref

import torch
from torch.utils.data import IterableDataset
from torch.utils.data._utils.collate import default_collate, default_convert
from torch.utils.data.dataloader import _BaseDataLoaderIter

from . import _board, _cgroup, _deaths, _fdpass, _protocol, _stoker, _worker
from ._errors import BatchEncodingError, CollateError, EngineError, WorkerCrashed, WorkerHung
from ._fetch import SkippedSample
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

log = logging.getLogger("stoker")

# How long shutdown waits for workers to leave by themselves before SIGKILL.
_EXIT_GRACE_S = 1.0
# How often worker status pages are checked for hangs (at most).
_HANG_CHECK_S = 0.1
# The data-stall notice looks every this many batches, once the loop has run this long.
_STALL_CHECK_BATCHES = 20
_STALL_MIN_S = 2.0


class _End:
    """An iterable dataset ran out in this worker."""

    def __init__(self, worker_id):
        self.worker_id = worker_id


class _Dropped:
    """Every sample of this task was skipped: no batch."""


class _Failure:
    """An exception raised in a worker, to be re-raised in the main process."""

    def __init__(self, report: dict):
        self.report = report

    def reraise(self):
        r = self.report
        exc_type = r["type"]
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


class MultiProcessIter(_BaseDataLoaderIter):
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

    # -- waiting -------------------------------------------------------------------------------
    def _wait(self):
        """The next message; deaths are handled (restart or raise) on the way."""
        timeout = self._timeout if self._timeout > 0 else None
        hang = self._opts["hang_timeout"]
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            slice_s = None
            if deadline is not None:
                slice_s = max(0.0, deadline - time.monotonic())
            if hang is not None:
                slice_s = _HANG_CHECK_S if slice_s is None else min(slice_s, _HANG_CHECK_S)
            ev = self._sup.wait(slice_s)
            if hang is not None:
                self._check_hangs(hang)
            if ev is None:
                if deadline is not None and time.monotonic() >= deadline:
                    self._raise_timeout()
                continue
            if ev[0] == "died":
                self._on_death(ev)
                continue
            return ev

    def _check_hangs(self, hang_timeout: float) -> None:
        now = time.monotonic()
        if now - self._last_hang_check < _HANG_CHECK_S:
            return
        self._last_hang_check = now
        for w in range(self._num_workers):
            if w in self._hung or not self._sup.has_worker(w):
                continue
            st = self._sup.status(w)
            if not st or st["state"] not in ("loading", "collating"):
                continue
            if st["state_seconds"] > hang_timeout:
                stack = self._capture_stack(w)
                self._hung[w] = (st["index"], st["state_seconds"], stack)
                try:
                    self._sup.signal(w, signal.SIGKILL)
                except EngineError:
                    pass

    def _capture_stack(self, worker_id: int, wait_s: float = 1.0) -> str:
        """Asks the worker for its Python stack (faulthandler on DUMP_SIGNAL) and returns it."""
        before = self._sup.read_log(worker_id, _protocol.LOG_CRASH, 1 << 20)
        try:
            self._sup.signal(worker_id, _worker.DUMP_SIGNAL)
        except EngineError:
            return ""
        end = time.monotonic() + wait_s
        text = before
        while time.monotonic() < end:
            time.sleep(0.02)
            text = self._sup.read_log(worker_id, _protocol.LOG_CRASH, 1 << 20)
            if len(text) > len(before) and text.endswith("\n"):
                time.sleep(0.02)
                text = self._sup.read_log(worker_id, _protocol.LOG_CRASH, 1 << 20)
                break
        new = text[len(before):] if text.startswith(before) else text
        return _deaths.trim_stack(new.strip())

    def _raise_timeout(self):
        info = self._task_info.get(self._rcvd_idx)
        msg = f"DataLoader timed out after {self._timeout} seconds"
        if not info or len(info) != 1 or not self._sup.has_worker(info[0]):
            raise WorkerHung(msg, worker_id=None, pid=None, index=None, stack="")
        w = info[0]
        st = self._sup.status(w) or {}
        stack = self._capture_stack(w)
        pid = self._procs[w].pid if self._procs[w] is not None else None
        index = st.get("index")
        doing = st.get("state", "working")
        msg += (
            f": waiting for batch {self._rcvd_idx} from worker {w} (pid {pid}), which has been "
            f"{doing} for {st.get('state_seconds', 0):.1f} s"
            + (f" on dataset index {index!r}" if index is not None else "")
            + "."
        )
        if stack:
            msg += f"\nIts Python stack now:\n{stack}"
        msg += (
            "\nWhat to do: find what that sample waits on (I/O, a lock, a subprocess); raise "
            "timeout if it is legitimately slow, or set hang_timeout to restart such workers."
        )
        raise WorkerHung(msg, worker_id=w, pid=pid, index=index, stack=stack)

    # -- deaths --------------------------------------------------------------------------------
    def _on_death(self, ev) -> None:
        _, worker_id, exit_code, signum, core = ev
        proc = self._procs[worker_id]
        if worker_id in self._leaving:
            self._leaving.discard(worker_id)
            self._sup.remove_worker(worker_id)
            if proc is not None:
                proc.join(timeout=_EXIT_GRACE_S)
            return
        status = self._sup.status(worker_id) or {}
        crash_log = self._sup.read_log(worker_id, _protocol.LOG_CRASH, 1 << 16)
        stderr_tail = self._sup.read_log(worker_id, _protocol.LOG_STDERR, 8192)
        self._sup.remove_worker(worker_id)
        if proc is not None:
            proc.join(timeout=_EXIT_GRACE_S)
            # multiprocessing may have reaped it first (Process.start() reaps finished children),
            # in which case only it knows the status.
            if proc.exitcode is not None:
                signum, exit_code = (-proc.exitcode, None) if proc.exitcode < 0 else (0, proc.exitcode)
        pid = proc.pid if proc is not None else status.get("pid")
        hung = self._hung.pop(worker_id, None)
        busy = status.get("state") in ("loading", "collating", "encoding")
        index = hung[0] if hung else (status.get("index") if busy else None)
        oom_now = _cgroup.oom_kills()
        oom = signum == signal.SIGKILL and hung is None and any(
            b is not None and a is not None and a > b for a, b in zip(oom_now, self._oom_before)
        )
        self._oom_before = oom_now
        cause, explanation = _deaths.describe(
            signum, exit_code, core, oom=oom, rss=status.get("rss_bytes"), index=index,
            crash_log=crash_log, stderr_tail=stderr_tail,
            hung=(hung[1], hung[2]) if hung else None,
        )
        tasks = sorted(t for t, info in self._task_info.items()
                       if len(info) == 1 and info[0] == worker_id)
        death = _deaths.Death(worker_id, pid, _deaths.signal_name(signum) if signum else None,
                              None if signum else exit_code, cause, index, self._state.epoch, tasks)
        self._state.deaths.append(death)
        self._board.add("deaths")

        def crashed(message):
            self._shutdown_workers()
            return WorkerCrashed(
                message, worker_id=worker_id, pid=pid, signal=death.signal,
                exit_code=death.exit_code, cause=cause, indices=self._indices_of(tasks, index),
            )

        head = f"DataLoader worker {worker_id} (pid {pid}) {explanation}"
        if not status and hung is None:
            # It died before it could report anything: a start-up failure (its dataset could
            # not be unpickled under spawn, an import failed...). Restarting would fail alike.
            raise crashed(
                f"DataLoader worker {worker_id} (pid {pid}) {cause} while starting, before it "
                "loaded anything; its traceback, if any, is above on stderr. With 'spawn' or "
                "'forkserver' the dataset and collate_fn are pickled and the worker imports "
                "them again: classes defined in __main__ of an interactive session or "
                "`python -c` cannot be found there; define them in a module."
            )
        # Quarantine: a sample in flight during `quarantine_after` deaths is poison.
        if index is not None and (busy or hung):
            key = _key(index)
            count = self._state.death_counts.get(key, 0) + 1
            self._state.death_counts[key] = count
            if count >= self._opts["quarantine_after"]:
                if self._opts["on_error"] != "skip":
                    raise crashed(
                        f"{head}\nDataset index {index!r} was being loaded during {count} worker "
                        "deaths: it is quarantined as poison. Pass on_error='skip' to skip it and "
                        "go on, or fix the sample."
                    )
                self._quarantine(index, f"quarantined after {count} worker deaths ({cause})")
        if self._opts["on_worker_death"] == "raise":
            raise crashed(head)
        if self._kind != _worker.MAP:
            raise crashed(
                f"{head}\nstoker cannot restart a worker of an IterableDataset without repeating or "
                "losing samples (its position in the stream died with it)."
            )
        budget = self._opts["max_restarts"]
        if budget is None:
            budget = 3 * self._num_workers
        if self._restarts >= budget:
            history = "\n".join(f"  - {d}" for d in self._state.deaths if d.epoch == self._state.epoch)
            raise crashed(
                f"{head}\nThat is {self._restarts + 1} worker deaths this epoch, over the budget "
                f"of max_restarts={budget}. Deaths this epoch:\n{history}"
            )
        self._restarts += 1
        self._restarts_by_worker[worker_id] += 1
        self._board.add("restarts")
        self._restart(worker_id, tasks)
        log.warning(
            "stoker: DataLoader worker %d (pid %s) %s%s; restarted it (%d of %d restarts this "
            "epoch) and re-issued %d batch(es).", worker_id, pid, cause,
            f" while loading dataset index {index!r}" if index is not None else "",
            self._restarts, budget, len(tasks),
        )

    def _restart(self, worker_id: int, tasks: list) -> None:
        self._start_worker(worker_id)
        for task in tasks:  # in their original order: results keep their places
            index = self._without_quarantined(task, self._task_index[task])
            self._task_index[task] = index
            if index is _Dropped:
                self._arrived(task, _Dropped())
            else:
                self._send_task(worker_id, task, index)

    def _quarantine(self, index, reason: str) -> None:
        key = _key(index)
        if key in self._state.quarantined:
            return
        self._state.quarantined.add(key)
        self._record_skip(index, reason)

    def _record_skip(self, index, reason: str) -> None:
        self._board.add("skipped")
        self._state.record_skip(SkippedSample(index, reason, self._state.epoch))

    def _indices_of(self, tasks, index):
        if index is not None:
            return [index]
        out = []
        for t in tasks:
            ix = self._task_index.get(t)
            if isinstance(ix, list):
                out.extend(ix)
            elif ix is not None and ix is not _Dropped:
                out.append(ix)
        return out

    # -- results -------------------------------------------------------------------------------
    def _arrived(self, task, data) -> None:
        """A result came for `task` outside the normal receive path (dropped by quarantine)."""
        info = self._task_info.get(task)
        if info is not None and len(info) == 1:
            self._task_info[task] = info + (data,)
            self._tasks_outstanding -= 1
            self._task_index.pop(task, None)

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
            ev = self._wait()
            _, worker_id, mtype, task, a, b, c, payload, pending = ev
            if mtype == MSG_SKIPPED:
                for index, reason in _protocol.decode_error(payload):
                    self._record_skip(index, reason)
                if a == 1 and task in self._task_info and len(self._task_info[task]) == 1:
                    return task, _Dropped()
                continue
            if task not in self._task_info or len(self._task_info[task]) != 1:
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

    def __next__(self):
        if self._started_at is None:
            self._started_at = time.monotonic()
            self._board.set("started_ns", _board.now_ns())
        batch = super().__next__()
        self._yielded += 1
        self._board.add("batches_yielded")
        if not self._stall_noted and self._yielded % _STALL_CHECK_BATCHES == 0:
            self._note_stall()
        return batch

    def _note_stall(self) -> None:
        """One log line when the training loop waits for data more than `stall_notice` of the
        time, naming the stage the workers spend most time in."""
        share = self._opts.get("stall_notice")
        elapsed = time.monotonic() - self._started_at
        if share is None or elapsed < _STALL_MIN_S or self._waited_s / elapsed < share:
            return
        self._stall_noted = True
        totals: dict = {}
        for w in range(self._num_workers):
            st = self._sup.status(w) if self._sup.has_worker(w) else None
            for k, v in (st or {}).get("seconds_in", {}).items():
                totals[k] = totals.get(k, 0.0) + v
        busy = {k: totals.get(k, 0.0) for k in ("loading", "collating", "encoding")}
        total = sum(busy.values()) or 1.0
        slowest = max(busy, key=busy.get)
        names = {"loading": "__getitem__ (loading samples)", "collating": "collate_fn",
                 "encoding": "writing batches into shared memory"}
        split = ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in busy.items())
        log.warning(
            "stoker: the training loop waited for data %.0f%% of the time over %d batches: the "
            "data is the bottleneck. Workers spend most of their time in %s (%s). More "
            "num_workers (this process may use %d CPUs), cheaper samples or a larger "
            "prefetch_factor would help.", 100 * self._waited_s / elapsed, self._yielded,
            names[slowest], split, len(os.sched_getaffinity(0)),
        )

    def stats(self) -> dict:
        now = time.monotonic()
        elapsed = (now - self._started_at) if self._started_at else 0.0
        workers = []
        for w in range(self._num_workers):
            st = self._sup.status(w) if self._sup.has_worker(w) else None
            proc = self._procs[w]
            entry = {"id": w, "pid": proc.pid if proc is not None else None,
                     "alive": bool(st), "restarts": self._restarts_by_worker[w]}
            if st:
                entry.update({
                    "state": st["state"], "index": st["index"], "task": st["task"],
                    "samples": st["samples"], "batches": st["batches"],
                    "rss_bytes": st["rss_bytes"], "bytes_sent": st["bytes_sent"],
                    "seconds": {"getitem": st["seconds_in"]["loading"],
                                "collate": st["seconds_in"]["collating"],
                                "encode": st["seconds_in"]["encoding"],
                                "idle": st["seconds_in"]["idle"]},
                })
            workers.append(entry)
        return {
            "workers": workers,
            "batches_yielded": self._yielded,
            "seconds_waiting_for_data": self._waited_s,
            "data_stall": (self._waited_s / elapsed) if elapsed > 0 else 0.0,
            "memory": self._sup.slot_usage(),
        }

    def _process_data(self, data, worker_id):
        self._workers_num_tasks[worker_id] -= 1
        self._try_put_index()
        if isinstance(data, _Dropped):
            return _Dropped
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


def _key(index):
    try:
        hash(index)
        return index
    except TypeError:
        return repr(index)


def _hashable_in(index, bad: set) -> bool:
    return _key(index) in bad
