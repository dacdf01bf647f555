"""The task table of one epoch: which worker has which task, what each task carries (to re-issue
it), and results that arrived before their turn (the reorder buffer).

Scheduling is torch's ``_MultiProcessingDataLoaderIter``'s, choice for choice, so the same tasks
reach the same workers in the same order and random augmentation drawn in workers matches torch
batch for batch. Plain bookkeeping, no processes: unit-tested on its own.

Thread contract: owned by the iterating thread; nothing here is shared.
"""

from __future__ import annotations

import itertools
from collections import deque


class _NoBatch:
    """Every sample of this task was skipped or quarantined: there is no batch."""

    def __repr__(self):
        return "NO_BATCH"


# A task's index when all of it is quarantined (nothing to send), and a task's result when
# every sample was skipped: either way the task yields nothing.
NO_BATCH = _NoBatch()


class TaskTable:
    def __init__(self, num_workers: int, prefetch_factor: int, in_order: bool):
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        # Workers 0..limit-1 take tasks (num_workers="auto" changes it during the epoch;
        # autotune/); torch's scheduling when limit == num_workers.
        self.limit = num_workers
        self.in_order = in_order
        self.unavailable: set[int] = set()  # workers that cannot run now (no room on a cluster)
        self.reset()

    def reset(self) -> None:
        n = self.num_workers
        self.send_idx = 0  # next task number
        self.rcvd_idx = 0  # next task to yield
        # task -> [worker] while in flight, [worker, result] once it arrived out of turn (a
        # result: a BatchReady, a WorkerFailure, a StreamEnded, or NO_BATCH)
        self.info: dict[int, list] = {}
        self.index: dict[int, object] = {}  # task -> what the sampler yielded (to re-issue)
        # task -> [(index, reason)] its worker skipped: recorded when the task's outcome reaches
        # the user, so a task loaded again (a re-issue, a resume) records its skips once
        self.skips: dict[int, list] = {}
        self.synthetic: deque = deque()  # (task, result) made without a worker
        self.outstanding = 0
        self.active = [True] * n  # torch's _workers_status
        self.per_worker = [0] * n  # torch's _workers_num_tasks
        self._cycle = itertools.cycle(range(n))

    def rotate(self, first: int) -> None:
        """The next worker picked is `first` (a resumed epoch continues the saved rotation)."""
        self._cycle = itertools.cycle(list(range(first, self.num_workers)) + list(range(first)))

    @property
    def max_tasks(self) -> int:
        return self.prefetch_factor * self.limit

    # -- sending ---------------------------------------------------------------------------------
    def has_room(self) -> bool:
        return self.outstanding < self.max_tasks

    def pick_worker(self) -> int | None:
        """The next active worker, as torch picks it; None when none may take a task."""
        for _ in range(self.num_workers):
            w = next(self._cycle)
            if self.active[w] and w < self.limit and w not in self.unavailable:
                if self.in_order:
                    return w
                if self.per_worker[w] < self.max_tasks // sum(self.active[:self.limit]):
                    return w
        return None

    def add(self, worker_id: int, index) -> int:
        task = self.send_idx
        self.info[task] = [worker_id]
        self.index[task] = index
        self.per_worker[worker_id] += 1
        self.outstanding += 1
        self.send_idx += 1
        return task

    # -- receiving -------------------------------------------------------------------------------
    def is_live(self, task: int) -> bool:
        """True while `task` waits for its result (a late duplicate of a re-issued task is not)."""
        info = self.info.get(task)
        return info is not None and len(info) == 1

    def in_flight(self, worker_id: int) -> list[int]:
        """The tasks `worker_id` holds, in the order they were sent."""
        return sorted(t for t, info in self.info.items() if len(info) == 1 and info[0] == worker_id)

    def queued_per_worker(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for info in self.info.values():
            if len(info) == 1:
                out[info[0]] = out.get(info[0], 0) + 1
        return out

    def received(self, task: int) -> None:
        self.outstanding -= 1
        self.index.pop(task, None)

    def done(self, worker_id: int) -> None:
        self.per_worker[worker_id] -= 1

    def ended(self, worker_id: int) -> None:
        """`worker_id`'s stream ended: the tasks it still holds will never be answered (a worker
        ignores tasks after its end). They stop counting as in flight, so they cannot fill the
        queue (torch leaves them counted, which is harmless only at a fixed depth: a shallower
        one under prefetch_factor="auto" would starve the other workers and end the epoch)."""
        for task in self.in_flight(worker_id):
            del self.info[task]
            self.index.pop(task, None)
            self.outstanding -= 1

    def index_at(self, task: int, position: int):
        """The dataset index at `position` of `task` (None when unknown)."""
        ix = self.index.get(task)
        if isinstance(ix, list):
            return ix[position] if position < len(ix) else None
        return None if ix is NO_BATCH else ix

    def move(self, task: int, worker_id: int) -> None:
        """`task`, in flight, goes to `worker_id` instead (its worker cannot run)."""
        old = self.info[task][0]
        self.info[task][0] = worker_id
        self.per_worker[old] -= 1
        self.per_worker[worker_id] += 1

    def indices_of(self, tasks) -> list:
        out = []
        for t in tasks:
            ix = self.index.get(t)
            if isinstance(ix, list):
                out.extend(ix)
            elif ix is not None and ix is not NO_BATCH:
                out.append(ix)
        return out

    def drain(self):
        """Every result still held (at shutdown): the caller discards them."""
        for key in list(self.info):
            info = self.info.pop(key)
            if len(info) == 2:
                yield info[1]
        self.synthetic.clear()
        self.skips.clear()

    def add_skips(self, task: int, records) -> None:
        self.skips.setdefault(task, []).extend(records)

    def reissued(self, task: int) -> None:
        """`task` goes to a worker again: what its lost attempt reported is void."""
        self.skips.pop(task, None)

    def take_skips(self, task: int) -> list:
        """The skips of `task`, whose outcome reaches the user now."""
        return self.skips.pop(task, [])

    def worker_of_next(self):
        """Skips the tasks that will never be answered (their worker's stream ended) and returns
        (the worker of the next task to yield, whether its result is here), or None when every
        task sent this epoch has been yielded."""
        while self.rcvd_idx < self.send_idx:
            info = self.info.get(self.rcvd_idx)
            if info:
                worker_id = info[0]
                if len(info) == 2 or self.active[worker_id]:
                    return worker_id, len(info) == 2
                del self.info[self.rcvd_idx]
            self.rcvd_idx += 1
        return None

    def take_next(self):
        """(worker, result) of the next task to yield, whose result is here."""
        task = self.rcvd_idx
        worker_id, result = self.info.pop(task)
        self.rcvd_idx += 1
        return task, worker_id, result
