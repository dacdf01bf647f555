"""The iterator's workers, supervised: started, waited on, watched for hangs, and every death
handled (the worker restarted and its tasks re-issued exactly once, in their places, or the
error raised), whatever placement runs them.

``Supervision`` composes the placement (``Workers``), the ``HangWatch`` and the ``Recovery``
policy, and works on the iterator's ``TaskTable``; it owns the workers' life, so it also shuts
them down (at the end of an epoch, on a final death, on ``del``). The iterator gives it the
``WorkerConfig`` workers start with (``config``, refreshed each epoch). No part holds a
reference back to the iterator, so an iterator is freed the moment it is dropped.

Thread contract: the thread that iterates; ``shutdown`` and ``closed`` from any thread.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

from ...common.errors import EngineError, WorkerCrashed
from ...wire.events import BatchReady, EpochBegun, WorkerExited, WorkerLost, WorkerReady
from ...worker.fetch import ITERABLE, MAP
from .starting import start_explained
from .tasks import NO_BATCH
from .watch import CHECK_EVERY_S

log = logging.getLogger("stoker")

# Without hang_timeout or timeout, the wait still wakes this often to look for stuck workers.
WATCH_S = 0.5
# While slots wait for GPU copies to finish (loader/gpu/), the wait wakes this often to hand them back:
# a worker may be waiting for one of them.
POLL_S = 0.002


class Supervision:
    def __init__(self, workers, tasks, watch, recovery, cursor, board, *, kind: int,
                 timeout: float, hang_timeout, start_names: dict):
        """`start_names`: what a failed start may blame, besides the dataset (collate_fn,
        worker_init_fn)."""
        self.workers = workers
        self._tasks = tasks
        self._watch = watch
        self._recovery = recovery
        self._cursor = cursor
        self._board = board
        self._kind = kind
        self._timeout = timeout
        self._hang_timeout = hang_timeout
        self._start_names = start_names
        self._closed = False
        self._close_lock = threading.Lock()
        self._config = None  # the WorkerConfig workers start with (the iterator's, per epoch)
        self._beginning = False  # persistent workers are being told a new epoch begins
        self._awaiting: set = set()  # ... and have not answered yet
        self._restarted_meanwhile: set = set()
        # tasks re-issued after a death of a worker that had several of their samples in
        # flight (threads_per_worker): loaded one sample at a time wherever they go, so that a
        # sample that kills again is named (and, after quarantine_after deaths, quarantined)
        self._one_at_a_time: set = set()
        self._poll = None  # also looked at while waiting (pending(), poll())

    @property
    def config(self):
        return self._config

    @config.setter
    def config(self, config) -> None:
        self._config = config
        self.workers.config_changed(config)

    # -- the end ---------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def shutdown(self) -> None:
        """Ends every worker, hands back every batch still held, closes the board (idempotent,
        any thread)."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        for data in self._tasks.drain():
            if hasattr(data, "discard"):
                data.discard()
        self.workers.shutdown()
        self._board.close()

    # -- starting --------------------------------------------------------------------------------
    def _start(self, start) -> None:
        start_explained(start, self.workers.start_method, self.config.dataset,
                        self._start_names)

    def start_all(self, count: int) -> None:
        self._start(lambda: self.workers.start_all(count, self.config))

    def start(self, worker_id: int, config=None) -> None:
        self._watch.forget(worker_id)
        config = self.config if config is None else config
        self._start(lambda: self.workers.start(worker_id, config))

    # -- sending ---------------------------------------------------------------------------------
    def send_task(self, worker_id: int, task: int, index) -> None:
        one_at_a_time = task in self._one_at_a_time
        if not self.workers.send_task(worker_id, task, index, one_at_a_time) and \
                self.workers.view(worker_id) is None:
            # A dying worker's tasks are re-issued when its death is seen; one that is not
            # running at all would never answer: fail loudly rather than wait forever.
            raise EngineError(f"stoker: task {task} went to worker {worker_id}, which is not "
                              "running (a bug in stoker: please report it)")

    def without_quarantined(self, index):
        """`index` less its quarantined samples (NO_BATCH when none is left)."""
        if self._kind != MAP or not self._recovery.any_quarantined():
            return index
        if isinstance(index, list):
            kept = [i for i in index if not self._recovery.is_quarantined(i)]
            if len(kept) == len(index):
                return index
            return kept if kept else NO_BATCH
        return NO_BATCH if self._recovery.is_quarantined(index) else index

    def begin_epoch(self, epoch: int, payload: bytes, limit: int) -> None:
        """Persistent workers: tells each running worker that `epoch` begins (`payload`:
        ``protocol.encode_resume``) and waits until each answered; starts again those of the
        first `limit` that are not running (their stream ended). Late results of the old epoch
        are dropped."""
        self._beginning = True
        self._one_at_a_time.clear()  # (task numbers start again each epoch)
        waiting = self._awaiting
        for w in range(self.workers.num_workers):
            if self.workers.view(w) is not None:
                # If it died, the wait below sees it.
                self.workers.begin_epoch(w, epoch, payload)
                waiting.add(w)
            elif w < limit:
                self.start(w)  # fresh, with this epoch's seeds and state
        while waiting:
            ev = self.wait()
            # A worker restarted meanwhile starts fresh: it is resumed already. One that cannot
            # run now (lost with its node) will not answer: when it runs again it starts fresh.
            waiting -= self._restarted_meanwhile
            waiting -= self._tasks.unavailable
            if isinstance(ev, EpochBegun):
                waiting.discard(ev.worker)
            elif isinstance(ev, BatchReady):
                ev.batch.discard()  # a late result of the old epoch
        self._restarted_meanwhile.clear()
        self._beginning = False

    # -- waiting ---------------------------------------------------------------------------------
    def poll_while_waiting(self, part) -> None:
        """`part` (``pending()``, ``poll()``) is polled before each wait and, while it has
        something pending, every few milliseconds during it."""
        self._poll = part

    def wait(self):
        """The next event; deaths are handled (restart or raise) on the way. None when a death
        produced something the caller must look at (an outcome made without a worker: a task
        whose samples are all quarantined; a restart while a new epoch begins)."""
        timeout = self._timeout if self._timeout > 0 else None
        hang = self._hang_timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        slice_max = CHECK_EVERY_S if hang is not None else WATCH_S
        poll = self._poll
        while True:
            slice_s = slice_max
            if poll is not None:
                poll.poll()
                if poll.pending():
                    slice_s = POLL_S
            if deadline is not None:
                slice_s = min(slice_s, max(0.0, deadline - time.monotonic()))
            ev = self.workers.wait(slice_s)
            self._watch.check(self._queued(), hang)
            if self._tasks.unavailable:  # a worker that runs may have come or got room
                self._rehome_all()
            if ev is None:
                if deadline is not None and time.monotonic() >= deadline:
                    raise self._timeout_error()
                continue
            if isinstance(ev, WorkerExited):
                if self._on_exit(ev) or self._restarted_meanwhile:
                    return None
                continue
            if isinstance(ev, WorkerLost):
                self._on_lost(ev)
                continue
            if isinstance(ev, WorkerReady):
                self._on_ready(ev.worker)
                continue
            return ev

    def _queued(self) -> dict:
        """worker -> messages it has not answered yet (tasks, a new epoch)."""
        queued = self._tasks.queued_per_worker()
        for w in self._awaiting:
            queued[w] = queued.get(w, 0) + 1
        return queued

    def _timeout_error(self):
        t = self._tasks
        w = t.waiting_on()
        if w is None:  # a new epoch of persistent workers waits for one to answer
            w = min(self._awaiting, default=None)
        return self._watch.timeout_error(self._timeout, t.next_to_hand_out, w)

    def _on_lost(self, ev: WorkerLost) -> None:
        """A worker cannot run now: its tasks go to the workers that can, in their order (the
        samples and their order do not change; with torch's seeding, their values may)."""
        t = self._tasks
        w = ev.worker
        if self._kind == ITERABLE:  # its stream is its own: the epoch waits for room
            log.warning("stoker: %s; worker %d's stream waits for it (an IterableDataset's "
                        "share cannot move to another worker).", ev.reason, w)
            return
        t.mark_unavailable(w)
        moved = self._rehome(w)
        log.warning("stoker: %s; its %d batch(es) went to the other workers, and it joins "
                    "again when the cluster has room.", ev.reason, moved)

    def _rehome(self, lost: int) -> int:
        """Moves the tasks of `lost` (a worker that cannot run now) to workers that run, past
        their usual depth if need be (else they would wait for the lost worker); returns how
        many moved. What cannot move now (no worker runs) moves when one does (``wait()``)."""
        t = self._tasks
        moved = 0
        for task in t.in_flight(lost):
            to = self._running_worker()
            if to is None:
                break
            t.reissue(task, t.index_of(task), to)
            self.send_task(to, task, t.index_of(task))
            moved += 1
        return moved

    def _rehome_all(self) -> None:
        for w in sorted(self._tasks.unavailable):
            self._rehome(w)

    def _running_worker(self):
        """The next worker in turn that runs now, else the running one with the fewest tasks
        (None when none runs)."""
        t = self._tasks
        for _ in range(t.num_workers):
            w = t.pick_worker()
            if w is None:
                break
            if self.workers.view(w) is not None:
                return w
        lost = t.unavailable
        running = [w for w in range(min(t.limit, t.num_workers))
                   if t.is_active(w) and w not in lost and self.workers.view(w) is not None]
        return min(running, key=t.held_by, default=None)

    def _on_ready(self, w: int) -> None:
        t = self._tasks
        t.mark_available(w)
        for task in t.in_flight(w):  # what could not move while it was lost
            self.send_task(w, task, t.index_of(task))
        log.info("stoker: worker %d runs again and takes work.", w)

    # -- deaths ----------------------------------------------------------------------------------
    def _on_exit(self, ex: WorkerExited) -> bool:
        """Restarts the worker and re-issues its tasks (or raises, per the policy); True when a
        re-issued task has no sample left to load (all quarantined): its outcome is here."""
        self._watch.forget(ex.worker)
        t = self._tasks
        tasks = t.in_flight(ex.worker)
        if ex.index is None and ex.position is not None and ex.task in tasks:
            # The sample's index is not an int (a str, a tuple): its place in the task names it.
            ex.index = t.index_at(ex.task, ex.position)
        indices = [ex.index] if ex.index is not None else t.indices_of(tasks)

        def crashed(death, indices, message):
            self.shutdown()
            return WorkerCrashed(message, worker_id=death.worker_id, pid=death.pid,
                                 signal=death.signal, exit_code=death.exit_code,
                                 cause=death.cause, indices=indices)

        self._recovery.on_exit(ex, tasks, indices, self._board, crashed)
        config = self.config
        # The new worker goes on from the dead one's state after its last outcome (a stream's
        # position, a dataset's own state, the generators): its re-issued tasks load as the
        # lost attempt would have.
        _, state = self._cursor.restart_state(ex.worker)
        if state is not None:
            config = dataclasses.replace(config, stream_states={ex.worker: state})
        if config.load.threads != 1:
            # It had (or may have had) a batch's samples in flight at once.
            self._one_at_a_time.update(tasks)
        self.start(ex.worker, config)
        if self._beginning:
            self._restarted_meanwhile.add(ex.worker)
        made = False
        for task in tasks:  # in their original order: results keep their places
            index = self.without_quarantined(t.index_of(task))
            t.reissue(task, index)
            if index is NO_BATCH:
                t.accept(task, NO_BATCH)
                made = True
            else:
                self.send_task(ex.worker, task, index)
        return made
