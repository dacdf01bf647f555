"""The task table of one epoch: one record per task (``Task``: its worker, what the sampler
yielded, its result or that it is still pending, the samples its worker skipped), the order they
are handed out in, and what a death re-issues.

Scheduling is torch's ``_MultiProcessingDataLoaderIter``'s, choice for choice, so the same tasks
reach the same workers in the same order and random augmentation drawn in workers matches torch
batch for batch. The table's methods are the only way to change it: send (``add``), take a
result (``accept``: it is handed out in its turn by ``take_ready``), re-issue or move a task
(``reissue``), retire a worker whose stream ended (``retire``), change how many workers take
tasks and how many each may hold (``set_limit``, ``set_depth``). Plain bookkeeping, no
processes: unit-tested on its own.

Thread contract: owned by the iterating thread; ``sent``, ``outstanding``, ``limit`` and
``prefetch_factor`` are plain numbers another thread may read (``stats()``).
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field


class _Marker:
    def __init__(self, name: str):
        self._name = name

    def __repr__(self):
        return self._name


# A task's index when all of it is quarantined (nothing to send), and a task's result when
# every sample was skipped: either way the task yields nothing.
NO_BATCH = _Marker("NO_BATCH")
# A task's result while it is in flight.
PENDING = _Marker("PENDING")
# A task's result when its worker's stream ended on it: handed out in its turn, yielding nothing.
STREAM_ENDED = _Marker("STREAM_ENDED")


@dataclass
class Task:
    """One task of the epoch, from the moment it is sent until it is handed out."""

    number: int  # its place in the sampler's order
    worker: int  # the worker that has it
    index: object  # what the sampler yielded (less what was quarantined), to re-issue it
    # PENDING while in flight; then a batch handle, a WorkerFailure, or NO_BATCH
    result: object = PENDING
    # [(index, reason)] its worker skipped: recorded when its outcome reaches the user, so a
    # task loaded again (a re-issue, a resume) records its skips once
    skips: list = field(default_factory=list)

    @property
    def pending(self) -> bool:
        return self.result is PENDING


class TaskTable:
    def __init__(self, num_workers: int, prefetch_factor: int, in_order: bool):
        self.num_workers = num_workers
        self.in_order = in_order
        self._depth = prefetch_factor
        # Workers 0..limit-1 take tasks (num_workers="auto" changes it during the epoch;
        # loader/autotune/); torch's scheduling when limit == num_workers.
        self._limit = num_workers
        self._unavailable: set[int] = set()  # workers that cannot run now (no room on a cluster)
        self.reset()

    def reset(self) -> None:
        """A new epoch: no task sent, every worker takes tasks again."""
        n = self.num_workers
        self._sent = 0  # the next task's number
        self._next = 0  # the next task to hand out, in order
        self._tasks: dict[int, Task] = {}
        self._arrived: deque[int] = deque()  # in_order=False: results in their arrival order
        self._pending = 0  # tasks in flight (torch's _tasks_outstanding)
        self._active = [True] * n  # torch's _workers_status
        self._per_worker = [0] * n  # torch's _workers_num_tasks
        self._cycle = itertools.cycle(range(n))

    def rotate(self, first: int) -> None:
        """The next worker picked is `first` (a resumed epoch continues the saved rotation)."""
        self._cycle = itertools.cycle(list(range(first, self.num_workers)) + list(range(first)))

    # -- how many ----------------------------------------------------------------------------------
    @property
    def sent(self) -> int:
        """Tasks sent this epoch."""
        return self._sent

    @property
    def outstanding(self) -> int:
        """Tasks in flight."""
        return self._pending

    @property
    def next_to_hand_out(self) -> int:
        """The number of the next task to hand out, in order."""
        return self._next

    @property
    def limit(self) -> int:
        """How many workers take tasks (0 .. limit-1)."""
        return self._limit

    @property
    def prefetch_factor(self) -> int:
        """How many tasks each worker may hold."""
        return self._depth

    @property
    def max_tasks(self) -> int:
        return self._depth * self._limit

    def set_limit(self, limit: int) -> None:
        """Workers ``0 .. limit-1`` take tasks from now on (a worker past it keeps what it has)."""
        self._limit = limit

    def set_depth(self, depth: int) -> None:
        """Each worker may hold up to `depth` tasks from now on."""
        self._depth = depth

    # -- workers -----------------------------------------------------------------------------------
    def is_active(self, worker_id: int) -> bool:
        """The worker takes tasks this epoch (its stream has not ended)."""
        return self._active[worker_id]

    def taking(self) -> list[int]:
        """The workers that take tasks now."""
        return [w for w in range(self._limit) if self._active[w]]

    def held_by(self, worker_id: int) -> int:
        """Tasks the worker holds (torch's count: until their outcome is handed out)."""
        return self._per_worker[worker_id]

    @property
    def unavailable(self) -> frozenset:
        """Workers that cannot run now (no room on a cluster): they get no task."""
        return frozenset(self._unavailable)

    def mark_unavailable(self, worker_id: int) -> None:
        self._unavailable.add(worker_id)

    def mark_available(self, worker_id: int) -> None:
        self._unavailable.discard(worker_id)

    def retire(self, worker_id: int) -> list[int]:
        """`worker_id`'s stream ended: it takes no more tasks this epoch, and the tasks it still
        holds will never be answered (a worker ignores tasks after its end). They are dropped,
        so they neither fill the queue (torch leaves them counted, which is harmless only at a
        fixed depth: a shallower one under prefetch_factor="auto" would starve the other
        workers and end the epoch) nor hold up the order. Returns their numbers."""
        self._active[worker_id] = False
        dropped = self.in_flight(worker_id)
        for number in dropped:
            del self._tasks[number]
            self._pending -= 1
            self._per_worker[worker_id] -= 1
        return dropped

    # -- sending -----------------------------------------------------------------------------------
    def has_room(self) -> bool:
        return self._pending < self.max_tasks

    def pick_worker(self) -> int | None:
        """The next active worker, as torch picks it; None when none may take a task."""
        for _ in range(self.num_workers):
            w = next(self._cycle)
            if self._active[w] and w < self._limit and w not in self._unavailable:
                if self.in_order:
                    return w
                if self._per_worker[w] < self.max_tasks // sum(self._active[:self._limit]):
                    return w
        return None

    def add(self, worker_id: int, index) -> int:
        """A task for `worker_id` with the sampler's `index`; returns its number."""
        number = self._sent
        self._tasks[number] = Task(number, worker_id, index)
        self._per_worker[worker_id] += 1
        self._pending += 1
        self._sent += 1
        return number

    # -- in flight ---------------------------------------------------------------------------------
    def is_live(self, number: int) -> bool:
        """True while task `number` waits for its result (a late duplicate of a re-issued
        task, or an answer to a task of an ended stream, is not)."""
        task = self._tasks.get(number)
        return task is not None and task.pending

    def in_flight(self, worker_id: int) -> list[int]:
        """The tasks `worker_id` holds, in the order they were sent."""
        return sorted(n for n, t in self._tasks.items() if t.pending and t.worker == worker_id)

    def queued_per_worker(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for t in self._tasks.values():
            if t.pending:
                out[t.worker] = out.get(t.worker, 0) + 1
        return out

    def waiting_on(self) -> int | None:
        """The worker that holds the next task to hand out, while its result is not here."""
        task = self._tasks.get(self._next)
        return task.worker if task is not None and task.pending else None

    def index_of(self, number: int):
        """What task `number` loads (the sampler's index, less what was quarantined)."""
        return self._tasks[number].index

    def index_at(self, number: int, position: int):
        """The dataset index at `position` of task `number` (None when unknown)."""
        task = self._tasks.get(number)
        ix = task.index if task is not None else None
        if isinstance(ix, list):
            return ix[position] if position < len(ix) else None
        return None if ix is NO_BATCH else ix

    def indices_of(self, numbers) -> list:
        out = []
        for n in numbers:
            task = self._tasks.get(n)
            ix = task.index if task is not None else None
            if isinstance(ix, list):
                out.extend(ix)
            elif ix is not None and ix is not NO_BATCH:
                out.append(ix)
        return out

    def add_skips(self, number: int, records) -> None:
        self._tasks[number].skips.extend(records)

    def take_skips(self, number: int) -> list:
        """The skips of task `number`, whose outcome reaches the user now."""
        task = self._tasks[number]
        skips, task.skips = task.skips, []
        return skips

    def reissue(self, number: int, index, worker_id: int | None = None) -> None:
        """Task `number` goes to a worker again (`worker_id`, else the one that had it) to load
        `index` (its index less what was quarantined since): what its lost attempt reported is
        void."""
        task = self._tasks[number]
        if worker_id is not None and worker_id != task.worker:
            self._per_worker[task.worker] -= 1
            self._per_worker[worker_id] += 1
            task.worker = worker_id
        task.index = index
        task.skips = []

    # -- results -----------------------------------------------------------------------------------
    def accept(self, number: int, result) -> None:
        """The outcome of live task `number`: a batch handle, a WorkerFailure or NO_BATCH. It
        is handed out in its turn (``take_ready``); with in_order=False, as it came."""
        task = self._tasks[number]
        assert task.pending, f"task {number} has its result already"
        task.result = result
        self._pending -= 1
        if not self.in_order:
            self._arrived.append(number)

    def take_ready(self) -> Task | None:
        """The next task to hand out, whose result is here (it leaves the table), or None when
        the next one's result has not come yet (or no task is left)."""
        if not self.in_order:
            while self._arrived:
                task = self._tasks.pop(self._arrived.popleft(), None)
                if task is not None:
                    self._per_worker[task.worker] -= 1
                    return task
            return None
        while self._next < self._sent:
            task = self._tasks.get(self._next)
            if task is not None and task.pending:
                return None
            self._next += 1
            if task is not None:  # (a missing one was dropped: its stream ended)
                del self._tasks[task.number]
                self._per_worker[task.worker] -= 1
                return task
        return None

    def finished(self) -> bool:
        """Every task sent this epoch was handed out or dropped."""
        return not self._tasks

    def drain(self):
        """Every result still held (at shutdown): the caller discards them."""
        tasks, self._tasks = self._tasks, {}
        self._arrived.clear()
        self._pending = 0
        for task in tasks.values():
            if not task.pending:
                yield task.result
