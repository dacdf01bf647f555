"""The multi-process iterator: torch's scheduling, stoker's transport and supervision.

It owns four parts, each with one job and its own state:
- ``TaskTable`` (_tasks.py): which worker has which task, the reorder buffer, re-issue records;
- ``WorkerSet`` (_worker_set.py): the processes, the only user of the C++ Supervisor; it waits,
  watches for hangs and names deaths;
- ``Recovery`` (_recovery.py): restart or raise on a death, the budget, quarantine;
- ``IterStats`` (_stats.py): counters, the data-stall notice, ``stats()``.

Task scheduling mirrors torch's ``_MultiProcessingDataLoaderIter`` (the same tasks go to the same
workers in the same order, so random augmentation drawn in workers matches torch batch for
batch). Tasks and results travel on one SOCK_SEQPACKET channel per worker, batches arrive as
zero-copy views of shared-memory slots, and a worker's death is seen through a pidfd in the same
wait as the data.

Thread contract: one thread iterates at a time (as with torch); ``stats()``, ``_workers`` and
``_shutdown_workers()`` may be called from any thread, also while another thread iterates.
"""

from __future__ import annotations

import pickle
import threading
import time
import warnings
import weakref

import torch
from torch.utils.data import IterableDataset, default_collate, default_convert

from . import _autotune, _board, _checkpoint, _enable, _protocol, _seeding, _torch_compat, _worker
from ._errors import (
    BatchEncodingError,
    CollateError,
    EngineError,
    SharedMemoryLimitError,
    WorkerCrashed,
    WorkerHung,
)
from ._options import state_of
from ._protocol import (
    MODE_AS_IS,
    MODE_COLLATE,
    MODE_CONVERT,
    MSG_BATCH,
    MSG_END,
    MSG_ERROR,
    MSG_ITER_STATE,
    MSG_RESUME,
    MSG_RESUMED,
    MSG_SKIPPED,
    MSG_TASK,
)
from ._recovery import Recovery
from ._stats import IterStats
from ._tasks import Dropped, End, TaskTable
from ._worker_set import CHECK_EVERY_S, Exit, WorkerSet

# Without hang_timeout or timeout, the wait still wakes this often to look for stuck workers.
_WATCH_S = 0.5


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
            stacklevel=5,
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


class MultiProcessIter(_torch_compat.base_iterator()):
    def __init__(self, loader) -> None:
        kept_rng = _checkpoint.before_iterator(loader)
        super().__init__(loader)
        # Checkpoint hooks (_checkpoint.py): a pending resume sets the base seed before workers
        # start; per-sample seeding (_seeding.py) needs the epoch that is about to begin.
        self._cursor = _checkpoint.attach(loader, self, kept_rng)
        self._seeder = _seeding.seeder_for(loader, self._base_seed,
                                           state_of(loader).epoch + 1)
        if loader.prefetch_factor <= 0:
            raise AssertionError(
                "prefetch_factor must be greater than 0 for MultiProcessingDataLoaderIter"
            )
        self._prefetch_factor = loader.prefetch_factor
        self._in_order = loader.in_order
        self._worker_init_fn = loader.worker_init_fn
        if _torch_compat.is_datapipe(self._dataset):  # shard across ranks and workers, as torch
            self._worker_init_fn = _torch_compat.sharding_worker_init_fn(
                self._worker_init_fn, self._world_size, self._rank)
        self._collate_mode = _collate_mode(loader)
        self._kind = _worker.ITERABLE if isinstance(self._dataset, IterableDataset) else _worker.MAP
        self._state, self._opts = _enable.state_and_options(loader)
        self._shutdown = False
        self._shutdown_lock = threading.Lock()
        n = self._num_workers
        self._board = _board.Board(n, _enable.served_by(loader))
        ctx = _context(loader)
        self._set = WorkerSet(ctx, n, self._worker_args(ctx.get_start_method()), self._board)
        self._tasks = TaskTable(n, self._prefetch_factor, self._in_order)
        self._stats = IterStats(self._board, self._set, self._opts["stall_notice"])
        self._tuner = self._measure = None
        tune_workers, tune_depth = _autotune.wanted(self._opts, self._kind == _worker.MAP, n)
        if tune_workers or tune_depth:
            self._tuner, self._measure = _autotune.attach(self, tune_workers, tune_depth)
        self._recovery = Recovery(self._state, self._opts, n, self._kind == _worker.MAP)
        self._recovery.stream_known = self._cursor.stream_known  # a stateful IterableDataset
        self._resetting = False
        self._restarted_in_reset: set = set()
        self._awaiting_resume: set = set()  # persistent workers asked to start a new epoch
        try:
            self._start(lambda: self._set.start_all(self._tasks.limit))
            self._reset(loader, first_iter=True)
        except BaseException:
            self._shutdown_workers()
            raise
        # Only a complete iterator is visible to stats() (from any thread).
        self._state.iterator = weakref.ref(self)
        _enable.announce(loader, self)  # stats(), stoker top and one log line name the server

    # -- workers -------------------------------------------------------------------------------
    def _worker_args(self, method: str) -> tuple:
        """The arguments of ``_worker.worker_main`` after (channel, worker id): a plain tuple,
        so the worker set holds no reference back to this iterator."""
        return (
            self._num_workers, self._kind, self._dataset, self._auto_collation,
            self._collate_fn, self._collate_mode, self._drop_last, self._base_seed,
            self._worker_init_fn,
            # The worker checks that its parent is still there; under forkserver its parent is
            # the fork server, not this process (the channel covers us).
            _worker.parent_pid_for(method),
            self._opts["on_error"], self._opts["max_retries"], self._board.token,
            self._opts["max_shared_memory"], self._shared_seed, self._seeder,
            self._cursor.iter_states,  # a resumed stateful IterableDataset (_iter_state.py)
        )

    def _start(self, start) -> None:
        """Runs `start` (starting workers); a pickling failure under spawn/forkserver is warned
        about as torch does and names the part of the dataset that cannot be pickled."""
        try:
            start()
        except (TypeError, AttributeError, pickle.PicklingError) as e:
            method = self._set._method
            if method == "fork":
                raise
            warnings.warn(
                "Got pickle error when attempting to start a worker Process. This might be "
                "because the worker Process arguments are not picklable: with "
                f"'{method}' the dataset, collate_fn and worker_init_fn are pickled. You can "
                "also try multiprocessing_context='fork'.",
                stacklevel=5,
            )
            culprit = _unpicklable_part(self._dataset)
            if culprit is None:
                for name in ("collate_fn", "worker_init_fn"):
                    fn = getattr(self, f"_{name}")
                    try:
                        pickle.dumps(fn)
                    except Exception as inner:
                        culprit = f"{name} ({fn!r}: {inner})"
                        break
            if culprit:
                raise type(e)(
                    f"{e}\nstoker: starting a worker with '{method}' pickles its arguments, and "
                    f"{culprit} cannot be pickled. Define it at module level, create it lazily "
                    "in the worker (in worker_init_fn or on first use in __getitem__), or use "
                    "multiprocessing_context='fork'."
                ) from e
            raise

    @property
    def _workers(self) -> list:
        """The live worker processes (torch's iterator has this list; some code reads it)."""
        return self._set.processes

    # -- epochs --------------------------------------------------------------------------------
    def _reset(self, loader, first_iter=False) -> None:
        super()._reset(loader, first_iter)
        self._state.epoch += 1
        self._cursor.start_epoch(self)  # may set _base_seed (a resume adopted mid-way)
        if self._seeder is not None:  # workers (re)started from now on get this epoch
            self._seeder.epoch = self._state.epoch
            self._seeder.base_seed = self._base_seed
        # Workers started from now on (restarts) get this epoch's seeds.
        self._set.worker_args = self._worker_args(self._set._method)
        self._stats.new_epoch(self._state.epoch)
        self._recovery.new_epoch()
        self._tasks.reset()
        self._cursor.first_worker(self._tasks)  # a resumed IterableDataset: whose turn it was
        if not first_iter:
            # Persistent workers: a new epoch; or load_state_dict on a live iterator. Results of
            # the old one still in flight are dropped.
            self._resetting = True
            waiting = self._awaiting_resume
            for w in range(self._num_workers):
                if self._set.has(w):
                    # The new epoch, its base seed (per-sample seeding) and an IterDataPipe's
                    # shared seed. If it died, the wait below sees it.
                    self._set.send(w, MSG_RESUME, self._state.epoch, 0,
                                   _protocol.encode_resume(self._base_seed, self._shared_seed,
                                                           self._cursor.iter_states.states))
                    waiting.add(w)
                elif w < self._tasks.limit:
                    # Stopped when its stream ended (a non-persistent IterableDataset): it
                    # starts again, fresh, with this epoch's seeds and state.
                    self._start(lambda w=w: self._set.start(w))
            while waiting:
                ev = self._wait()
                # A worker restarted meanwhile starts fresh: it is resumed already.
                waiting -= self._restarted_in_reset
                if ev is not None and ev[0] == "message" and ev[2] == MSG_RESUMED:
                    waiting.discard(ev[1])
            self._restarted_in_reset.clear()
            self._resetting = False
            if self._measure is not None:  # the new epoch's counters start from zero
                _autotune.restart_window(self)
        for _ in range(self._tasks.max_tasks):
            self._try_put_index()

    def _try_put_index(self) -> None:
        t = self._tasks
        if not t.has_room():  # num_workers="auto" just retired a worker: fewer tasks in flight
            return
        try:
            index = self._next_index()
        except StopIteration:
            return
        worker_id = t.pick_worker()
        if worker_id is None:
            return
        index = self._without_quarantined(index)
        task = t.add(worker_id, index)
        self._cursor.sent(task)
        if index is Dropped:
            t.synthetic.append((task, Dropped()))
            return
        self._send_task(worker_id, task, index)

    def _send_task(self, worker_id, task, index) -> None:
        fmt, payload = _protocol.encode_index(index)
        if not self._set.send(worker_id, MSG_TASK, task, fmt, payload) \
                and not self._set.has(worker_id):
            # A dying worker's tasks are re-issued when its death is seen; one that is not
            # running at all would never answer: fail loudly rather than wait forever.
            raise EngineError(f"stoker: task {task} went to worker {worker_id}, which is not "
                              "running (a bug in stoker: please report it)")

    def _without_quarantined(self, index):
        if not self._state.quarantined or self._kind != _worker.MAP:
            return index
        if isinstance(index, list):
            kept = [i for i in index if not self._recovery.is_quarantined(i)]
            if len(kept) == len(index):
                return index
            return kept if kept else Dropped
        return Dropped if self._recovery.is_quarantined(index) else index

    # -- waiting -------------------------------------------------------------------------------
    def _wait(self):
        """The next message; deaths are handled (restart or raise) on the way. None when a
        death produced something the caller must look at (a synthetic result, a restart while
        a new epoch starts)."""
        timeout = self._timeout if self._timeout > 0 else None
        hang = self._opts["hang_timeout"]
        deadline = None if timeout is None else time.monotonic() + timeout
        slice_max = CHECK_EVERY_S if hang is not None else _WATCH_S
        while True:
            slice_s = slice_max
            if deadline is not None:
                slice_s = min(slice_s, max(0.0, deadline - time.monotonic()))
            ev = self._set.wait(slice_s)
            self._set.check(self._queued(), hang)
            if ev is None:
                if deadline is not None and time.monotonic() >= deadline:
                    self._raise_timeout()
                continue
            if isinstance(ev, Exit):
                self._on_exit(ev)
                if self._tasks.synthetic or self._restarted_in_reset:
                    return None
                continue
            return ev

    def _queued(self) -> dict:
        """worker -> messages it has not answered yet (tasks, a new epoch's RESUME)."""
        queued = self._tasks.queued_per_worker()
        for w in self._awaiting_resume:
            queued[w] = queued.get(w, 0) + 1
        return queued

    def _raise_timeout(self):
        info = self._tasks.info.get(self._tasks.rcvd_idx)
        msg = f"DataLoader timed out after {self._timeout} seconds"
        if info and len(info) == 1:
            w = info[0]
        else:  # a new epoch of persistent workers waits for one to answer
            w = min(self._awaiting_resume, default=None)
        if w is None or not self._set.has(w):
            raise WorkerHung(msg, worker_id=None, pid=None, index=None, stack="")
        st = self._set.status(w) or {}
        pid = self._set.pid(w)
        index = st.get("index")
        stuck = self._set.stuck().get(w)
        if stuck is not None:
            if not stuck.stack and not stuck.stopped:
                stuck.stack = self._set.capture_stack(w)
            stack = stuck.stack
            msg += f": waiting for batch {self._tasks.rcvd_idx}; {stuck.describe()}"
        else:
            stack = self._set.capture_stack(w)
            doing = st.get("state", "working")
            msg += (
                f": waiting for batch {self._tasks.rcvd_idx} from worker {w} (pid {pid}), which "
                f"has been {doing} for {st.get('state_seconds', 0):.1f} s"
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

    def _on_exit(self, ex) -> None:
        tasks = self._tasks.in_flight(ex.worker_id)
        if ex.index is None and ex.position is not None and ex.task in tasks:
            # The sample's index is not an int (a str, a tuple): its place in the task names it.
            ix = self._tasks.index.get(ex.task)
            if isinstance(ix, list) and ex.position < len(ix):
                ex.index = ix[ex.position]
            elif not isinstance(ix, list) and ix is not None and ix is not Dropped:
                ex.index = ix
        indices = [ex.index] if ex.index is not None else self._tasks.indices_of(tasks)

        def crashed(death, indices, message):
            self._shutdown_workers()
            return WorkerCrashed(message, worker_id=death.worker_id, pid=death.pid,
                                 signal=death.signal, exit_code=death.exit_code,
                                 cause=death.cause, indices=indices)

        self._recovery.on_exit(ex, tasks, indices, self._board, crashed)
        self._set.restarts[ex.worker_id] += 1
        self._start(lambda: self._set.start(ex.worker_id))
        if self._resetting:
            self._restarted_in_reset.add(ex.worker_id)
        for task in tasks:  # in their original order: results keep their places
            index = self._without_quarantined(self._tasks.index[task])
            self._tasks.index[task] = index
            if index is Dropped:
                self._tasks.synthetic.append((task, Dropped()))
            else:
                self._send_task(ex.worker_id, task, index)

    # -- results -------------------------------------------------------------------------------
    def _get_data(self):
        t = time.monotonic()
        try:
            return self._receive()
        finally:
            self._stats.waited(time.monotonic() - t)

    def _receive(self):
        tasks = self._tasks
        while True:
            if tasks.synthetic:
                task, data = tasks.synthetic.popleft()
                if tasks.is_live(task):
                    return task, data
                continue
            ev = self._wait()
            if ev is None:  # a death produced a synthetic result: look again
                continue
            _, worker_id, mtype, task, a, b, c, payload, pending = ev
            live = tasks.is_live(task)
            if mtype == MSG_ITER_STATE:
                if live:
                    self._cursor.iter_state(task, worker_id, payload)
                continue
            if live and (mtype in (MSG_BATCH, MSG_ERROR) or (mtype == MSG_SKIPPED and a == 1)):
                self._cursor.arrived(task, worker_id)  # the state a restart continues from
            if mtype == MSG_SKIPPED:
                if live:  # a re-issued task's first attempt already reported its skips
                    for index, reason in _protocol.decode_error(payload):
                        self._recovery.record_skip(index, reason, self._board)
                    if a == 1:
                        return task, Dropped()
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
                return task, End(worker_id)
            # anything else (a late RESUMED) is not a result

    def __next__(self):
        if self._cursor.superseded() and not self._shutdown:
            # load_state_dict after this iterator began: start over from the loaded state.
            self._reset(self._cursor.loader)
        while self._cursor.discarding():  # IterableDataset: batches received before the resume
            self._next_data()
            self._num_yielded += 1
        self._stats.asking()
        batch = super().__next__()
        self._stats.yielded_one()
        if self._measure is not None and self._measure.due():
            _autotune.tune(self)
        return batch

    def _next_data(self):
        t = self._tasks
        while True:
            while t.rcvd_idx < t.send_idx:
                info = t.info.get(t.rcvd_idx)
                if info:
                    worker_id = info[0]
                    if len(info) == 2 or t.active[worker_id]:
                        break
                    del t.info[t.rcvd_idx]
                t.rcvd_idx += 1
            else:
                self._cursor.finished()
                if not self._persistent_workers:
                    self._shutdown_workers()
                raise StopIteration

            if len(t.info[t.rcvd_idx]) == 2:
                task = t.rcvd_idx
                worker_id, data = t.info.pop(task)
                t.rcvd_idx += 1
                out = self._process_data(data, worker_id, task)
                if out is Dropped:
                    continue
                return out

            assert not self._shutdown and t.outstanding > 0
            idx, data = self._get_data()
            task = idx
            t.received(idx)
            if isinstance(data, End):
                if self._persistent_workers:
                    t.active[data.worker_id] = False
                else:
                    self._mark_worker_as_unavailable(data.worker_id)
                t.ended(data.worker_id)
                self._try_put_index()
                continue
            if idx != t.rcvd_idx:
                if not self._in_order:
                    worker_id = t.info.pop(idx)[0]
                    out = self._process_data(data, worker_id, task)
                    if out is Dropped:
                        continue
                    return out
                t.info[idx].append(data)
            else:
                worker_id = t.info.pop(idx)[0]
                t.rcvd_idx += 1
                out = self._process_data(data, worker_id, task)
                if out is Dropped:
                    continue
                return out

    def _process_data(self, data, worker_id, task):
        self._tasks.done(worker_id)
        self._cursor.consumed(task)
        self._try_put_index()
        if isinstance(data, Dropped):
            return Dropped
        if isinstance(data, _Failure):
            data.reraise(self._set.slot_usage)
        batch = data.decode()
        if self._pin_memory:
            batch = _torch_compat.pin_memory(batch, self._pin_memory_device)
        return batch

    def _mark_worker_as_unavailable(self, worker_id, shutdown=False) -> None:
        self._tasks.active[worker_id] = False
        self._set.stop(worker_id)

    # -- observing (any thread) ------------------------------------------------------------------
    def stats(self) -> dict:
        out = self._stats.snapshot()
        if self._tuner is not None:
            out["autotune"] = self._tuner.snapshot()
        return out

    # -- shutdown (any thread) -------------------------------------------------------------------
    def _shutdown_workers(self) -> None:
        with self._shutdown_lock:
            if self._shutdown:
                return
            self._shutdown = True
        for data in self._tasks.drain():
            if hasattr(data, "discard"):
                data.discard()
        self._set.shutdown()
        self._board.close()

    def __del__(self):
        try:
            self._shutdown_workers()
        except Exception:
            pass
