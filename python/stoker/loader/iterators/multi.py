"""The multi-process iterator: torch's scheduling over stoker's workers, supervised.

It composes parts that each own their state and are reached through their methods:

- ``TaskTable`` (tasks.py): one record per task (its worker, its index, its result or that it
  is pending, its skips), the order they are handed out in, what a death re-issues;
- ``Workers`` (placements/): where workers run (local processes, Ray actors, or both).
  Everything here talks to workers only through that interface;
- ``Supervision`` (supervision.py): starts workers, waits on them, and handles each death, with
  ``HangWatch`` (watch.py: samples that take too long, workers that do not take their work) and
  ``Recovery`` (recovery.py: restart or raise, the budget, quarantine, skips);
- ``IterStats`` (stats.py): counters, the data-stall notice, ``stats()``;
- ``Cursor`` (loader/resume/cursor.py): the position in the epoch, for ``state_dict()``;
- ``Controller`` (loader/autotune/), when a count or a depth is tuned: it acts through the ``Tunable``
  methods at the end of this class.

Task scheduling mirrors torch's ``_MultiProcessingDataLoaderIter`` (the same tasks go to the same
workers in the same order, so random augmentation drawn in workers matches torch batch for
batch); batches arrive as zero-copy views of the workers' buffers; a worker's death arrives as
an event in the same wait as the data.

Thread contract: one thread iterates at a time (as with torch); ``stats()``, ``closed``,
``_workers`` and ``_shutdown_workers()`` may be called from any thread, also while another thread
iterates.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from torch.utils.data import IterableDataset, default_collate, default_convert

from ...common import torch_compat as _torch_compat
from ...config import seeding
from ...config.load import LoadSettings
from ...config.options import shared_memory_share
from ...config.records import records_of
from ...placements.choose import workers_for
from ...wire import protocol
from ...wire.board import Board
from ...wire.events import BatchReady, EpochBegun, SamplesSkipped, StreamEnded, TaskFailed
from ...worker.fetch import ITERABLE, MAP
from ...worker.loop import WorkerConfig
from ..autotune.controller import Controller, wanted
from ..gpu.last_mile import last_mile
from ..resume.cursor import Cursor
from . import exit as _exit
from .failure import WorkerFailure
from .handout import Handout
from .recovery import Recovery
from .starting import context_for
from .stats import IterStats
from .supervision import Supervision
from .tasks import NO_BATCH, STREAM_ENDED, TaskTable
from .watch import HangWatch

log = logging.getLogger("stoker")


def _collate_mode(loader) -> int:
    if loader.collate_fn is default_collate:
        return protocol.MODE_COLLATE
    if loader.collate_fn is default_convert:
        return protocol.MODE_CONVERT
    return protocol.MODE_AS_IS


class MultiProcessIter(_torch_compat.base_iterator()):
    def __init__(self, loader, options, served_by: str) -> None:
        """`options`: the ``config.Options`` this iterator runs with; `served_by`:
        "stoker.DataLoader" or "stoker.enable()" (stats, the log line, ``stoker top``)."""
        self._records = records_of(loader)
        self._cursor = Cursor(loader, self._records)
        with self._cursor.drawing_base_seed():
            super().__init__(loader)
        self._base_seed = self._cursor.base_seed(self._base_seed)
        self._options = options
        self._seeder = seeding.seeder_for(options, self._base_seed, self._records.epoch + 1)
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
        self._kind = ITERABLE if isinstance(self._dataset, IterableDataset) else MAP
        self._discard = 0
        n = self._num_workers
        cls = type(loader).__qualname__
        self._board = Board(n, served_by if cls == "DataLoader" and served_by ==
                            "stoker.DataLoader" else f"{served_by} {cls}",
                            prefetch_factor=self._prefetch_factor)
        self.workers = workers_for(options.placement, context_for(loader), n, self._board.token,
                                   stream=self._kind == ITERABLE)
        # how every worker loads (threads_per_worker resolved: unset is "auto" for an async
        # dataset; each worker's share of the CPUs), made once and carried in each WorkerConfig
        self._load = LoadSettings.of(options, self._dataset, self.workers.cpus_per_worker())
        self._watch = HangWatch(self.workers)
        self._tasks = TaskTable(n, self._prefetch_factor, self._in_order)
        self._recovery = Recovery(self._records, options, n, self._kind == MAP,
                                  stream_known=self._cursor.can_restart_stream)
        self._stats = IterStats(self._board, self.workers, self._watch,
                                self._recovery.restarts_by_worker, options.stall_notice,
                                self._load.threads)
        self._shm_cap = options.shared_memory_cap()
        self._tuner = None
        tune_workers, tune_depth = wanted(options, self._kind == MAP, n)
        if tune_workers or tune_depth:
            self._tuner = Controller(self._records, self._board, self._stats, self.workers,
                                     num_workers=n, depth=self._prefetch_factor,
                                     tune_workers=tune_workers, tune_depth=tune_depth,
                                     dataset=self._dataset,
                                     batch_size=getattr(loader, "batch_size", None))
            self._tasks.set_limit(self._tuner.initial_workers)
            if self._tuner.initial_depth is not None:
                self._tasks.set_depth(self._tuner.initial_depth)
        # max_shared_memory is divided among the workers running (num_workers="auto" starts
        # some of them; each one added takes its part from the others: set_workers).
        self._shm_share = shared_memory_share(self._shm_cap, self._tasks.limit)
        if self._tuner is not None:
            self._tuner.set_memory_share(self._shm_share)
        self._sup = Supervision(
            self.workers, self._tasks, self._watch, self._recovery, self._cursor, self._board,
            kind=self._kind, timeout=self._timeout, hang_timeout=options.hang_timeout,
            start_names={"collate_fn": self._collate_fn, "worker_init_fn": self._worker_init_fn})
        self._sup.config = self._worker_config(self._cursor.starting_stream_states())
        # pin_memory: slots page-locked once; device: batches copied ahead (loader/gpu/).
        self._mile = last_mile(loader.pin_memory, options.device, self._next_host)
        self._stage = self._mile.stage if self._mile is not None else None
        self._handout = Handout(self._stage)  # when outcomes are recorded
        if self._mile is not None:
            self._sup.poll_while_waiting(self._mile)
        try:
            self._sup.start_all(self._tasks.limit)
            self._reset(loader, first_iter=True)
        except BaseException:
            self._shutdown_workers()
            raise
        # Only a complete iterator is visible to stats() (from any thread).
        self._records.set_iterator(self)
        self._announce(loader, served_by)

    def _announce(self, loader, served_by: str) -> None:
        """Records who serves the loader (``stats()['served_by']``), logs it at its first
        iterator, and has the workers stopped cleanly at interpreter exit."""
        _exit.track(self)
        first = self._records.served_by is None
        self._records.served_by = served_by
        if first:
            cls = type(loader)
            log.info("stoker: %s.%s (%s) is served by stoker's engine: %d workers (%s), %s",
                     cls.__module__, cls.__qualname__, served_by, self._num_workers,
                     self.workers.start_method, self._options.describe())

    # -- workers -------------------------------------------------------------------------------
    def _worker_config(self, stream_states: dict) -> WorkerConfig:
        return WorkerConfig(
            num_workers=self._num_workers, kind=self._kind, dataset=self._dataset,
            auto_collation=self._auto_collation, collate_fn=self._collate_fn,
            collate_mode=self._collate_mode, drop_last=self._drop_last,
            base_seed=self._base_seed, init_fn=self._worker_init_fn, load=self._load,
            shared_memory_share=self._shm_share, shared_seed=self._shared_seed,
            seeder=self._seeder, stream_states=stream_states)

    @property
    def _workers(self) -> list:
        """The worker processes (torch's iterator has this list; some code reads it)."""
        return self.workers.processes

    @property
    def closed(self) -> bool:
        """The workers were shut down (end of a non-persistent epoch, a failure, ``del``)."""
        sup = self.__dict__.get("_sup")
        return sup is None or sup.closed

    @property
    def base_seed(self) -> int:
        """The seed this iterator's workers were started from (persistent ones keep it)."""
        return self._base_seed

    def reusable(self) -> bool:
        """The next ``iter()`` of a persistent loader may go on with these workers: they run,
        and no loaded state waits for them (a resume starts each worker from its saved state or
        seeds it as the saved epoch's was: new workers do)."""
        return not self.closed and not self._cursor.loaded()

    # -- epochs --------------------------------------------------------------------------------
    def _reset(self, loader, first_iter=False) -> None:
        self._cursor.prepare_epoch()
        super()._reset(loader, first_iter)
        start = self._cursor.begin_epoch(self._sampler_iter, self._base_seed)
        self._sampler_iter, self._base_seed = start.sampler_iter, start.base_seed
        self._discard = start.discard
        epoch = self._records.epoch
        if self._seeder is not None:  # workers (re)started from now on get this epoch
            self._seeder.begin_epoch(epoch, self._base_seed)
        # Workers started from now on (restarts) get this epoch's seeds and states.
        self._sup.config = self._worker_config(start.stream_states)
        self._stats.new_epoch(epoch)
        self._recovery.new_epoch()
        if self._stage is not None:  # batches copied ahead belong to the old epoch
            self._stage.clear()
        self._tasks.reset()
        if start.first_worker is not None:  # a resumed epoch: whose turn it was
            self._tasks.rotate(start.first_worker)
        for w in sorted(start.ended):  # their streams had ended when the state was taken
            self._tasks.retire(w)
        if not first_iter:
            # Persistent workers: a new epoch; or load_state_dict on a live iterator. Results of
            # the old one still in flight are dropped.
            self._sup.begin_epoch(epoch, protocol.encode_resume(
                self._base_seed, self._shared_seed, start.stream_states), self._tasks.limit)
            if self._tuner is not None:  # the new epoch's counters start from zero
                self._tuner.restart_window(self)
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
        index = self._sup.without_quarantined(index)
        task = t.add(worker_id, index)
        self._cursor.sent(task)
        if index is NO_BATCH:  # every sample of it is quarantined: its outcome is here
            t.accept(task, NO_BATCH)
            return
        self._sup.send_task(worker_id, task, index)

    # -- results -------------------------------------------------------------------------------
    def _collect(self) -> None:
        """Waits for the next event and gives what it says to the task table: an outcome (a
        batch handle, a WorkerFailure, NO_BATCH), skips, a stream's state or its end. Returns
        after one event, or after a death made an outcome (a quarantined task)."""
        t = time.monotonic()
        try:
            ev = self._sup.wait()
        finally:
            self._stats.waited(time.monotonic() - t)
        if ev is None or isinstance(ev, EpochBegun):  # a death made a result; a late answer
            return
        tasks = self._tasks
        if not tasks.is_live(ev.task):  # a late duplicate (a re-issued task's first attempt)
            if isinstance(ev, BatchReady):
                ev.batch.discard()
            return
        self._cursor.observe(ev)  # a stream's state, and the outcomes it goes with
        if isinstance(ev, SamplesSkipped):
            tasks.add_skips(ev.task, ev.records)
            if ev.dropped:
                tasks.accept(ev.task, NO_BATCH)
        elif isinstance(ev, BatchReady):
            tasks.accept(ev.task, ev.batch)
        elif isinstance(ev, TaskFailed):
            tasks.accept(ev.task, WorkerFailure(ev.report))
        elif isinstance(ev, StreamEnded):
            self._stream_ended(ev)

    def _stream_ended(self, ev: StreamEnded) -> None:
        """A worker's IterableDataset ran out: it takes no more tasks this epoch. The task that
        found the end is handed out in its turn (its state, the stream's last, is the user's
        then); the tasks after it will never be answered."""
        tasks = self._tasks
        tasks.accept(ev.task, STREAM_ENDED)
        for number in tasks.retire(ev.worker):
            self._cursor.passed(number)
        if not self._persistent_workers:
            self._mark_worker_as_unavailable(ev.worker)
        self._try_put_index()

    def __next__(self):
        if self._cursor.pending() and not self.closed:
            # load_state_dict after this iterator began: start over from the loaded state.
            self._reset(self._cursor.loader)
        self._stats.asking()
        batch = super().__next__()
        self._stats.yielded_one()
        if self._tuner is not None and self._tuner.due(self):
            self._tuner.tune(self, self._stats.yielded)
        return batch

    def _next_data(self):
        if self._stage is not None:
            return self._stage.next()
        return self._next_host()

    def _next_host(self):
        """The next batch as host tensors (views of its slot), in torch's order."""
        t = self._tasks
        while not t.finished():
            task = t.take_ready()
            if task is None:  # the next one's result has not come: wait for an event
                assert not self.closed and t.outstanding > 0
                self._collect()
                continue
            out = self._process_data(task)
            if out is not NO_BATCH:
                return out
        self._handout.later(self._cursor.finished)
        if not self._persistent_workers:
            self._shutdown_workers()
        raise StopIteration

    def _process_data(self, task):
        """Hands out `task`'s outcome (it left the table): the batch, or its error raised."""
        data = task.result
        if data is STREAM_ENDED:  # no batch: the worker's state is the user's now
            self._handout.later(self._delivered, task.number, task.worker, task.skips, False)
            return NO_BATCH
        if self._discard > 0:  # a stream read again after a resume: the user had this one
            self._discard -= 1
            self._num_yielded += 1
            self._handout.replayed(self._delivered, task.number, task.worker, task.skips)
            self._try_put_index()
            if hasattr(data, "discard"):
                data.discard()
            return NO_BATCH
        self._handout.later(self._delivered, task.number, task.worker, task.skips)
        self._try_put_index()
        if data is NO_BATCH:
            return NO_BATCH
        if isinstance(data, WorkerFailure):
            data.reraise(self.workers.slot_usage)
        if self._mile is not None:
            return self._mile.decode(data)
        batch = data.decode()
        if self._pin_memory:  # an accelerator that is not CUDA: torch's copy
            batch = _torch_compat.pin_memory(batch, self._pin_memory_device)
        return batch

    def _delivered(self, task: int, worker: int, skips, outcome: bool = True) -> None:
        self._cursor.delivered(task, worker, outcome)
        self._record_skips(skips)

    def _record_skips(self, skips) -> None:
        """Skipped samples are recorded as their batch's outcome reaches the user; a batch
        dropped after a resume was delivered before it, and its skips recorded then."""
        if self._handout.replaying:
            return
        for index, reason in skips:
            self._recovery.record_skip(index, reason, self._board)

    def _mark_worker_as_unavailable(self, worker_id, shutdown=False) -> None:
        """torch's name: the worker's stream ended and it is not persistent: it is stopped."""
        self.workers.stop(worker_id)
        self._watch.forget(worker_id)

    # -- Tunable (loader/autotune/controller.py) --------------------------------------------------------
    def depth(self) -> int:
        return self._tasks.prefetch_factor

    def active_workers(self) -> int:
        return self._tasks.limit

    def taking(self) -> list[int]:
        return self._tasks.taking()

    def _running(self) -> list[int]:
        return [w for w in range(self._num_workers) if self.workers.view(w) is not None]

    def set_workers(self, active: int) -> None:
        t = self._tasks
        running = self._running()
        new = [w for w in range(t.limit, active) if w not in running]
        if new:  # the running workers give up part of their share first
            self._share_memory(len(running) + len(new), running)
        for w in new:
            self._sup.start(w)
        t.set_limit(active)

    def _share_memory(self, workers: int, running: list[int]) -> None:
        share = shared_memory_share(self._shm_cap, workers)
        if share == self._shm_share:
            return
        self._shm_share = share
        for w in running:
            self.workers.set_memory_share(w, share)
        self._sup.config = dataclasses.replace(self._sup.config, shared_memory_share=share)
        if self._tuner is not None:
            self._tuner.set_memory_share(share)

    def set_depth(self, depth: int) -> None:
        self._tasks.set_depth(depth)

    def refill(self) -> None:
        t = self._tasks
        while t.has_room() and not self.closed:
            sent = t.sent
            self._try_put_index()
            if t.sent == sent:  # the sampler is done for this epoch
                break

    # -- observing (any thread) ------------------------------------------------------------------
    def stats(self) -> dict:
        out = self._stats.snapshot()
        t = self._tasks
        out["tasks"] = {"sent": t.sent, "in_flight": t.outstanding,
                        "active_workers": t.limit, "prefetch_factor": t.prefetch_factor}
        if self._tuner is not None:
            out["autotune"] = self._tuner.snapshot()
        serving = self.workers.serving()
        if serving is not None:
            out["pool"] = serving
        return out

    # -- shutdown (any thread) -------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stops the workers and frees their memory (idempotent); torch's name for it is
        ``_shutdown_workers``."""
        self._shutdown_workers()

    def _shutdown_workers(self) -> None:
        sup = self.__dict__.get("_sup")
        try:
            if sup is not None:  # first: no worker writes into a slot a copy may still read
                sup.shutdown()
            else:  # __init__ failed before the workers started
                board = self.__dict__.get("_board")
                if board is not None:
                    board.close()
        finally:
            mile = self.__dict__.get("_mile")
            if mile is not None:  # copies that read slots finish, slots are unregistered
                mile.close()

    def __del__(self):
        try:
            self._shutdown_workers()
        except Exception:
            pass
