"""stoker.placements.node.group: one dataset's workers in the node pool, driven by hand. The
group is given fake workers (the methods ``LocalProcesses`` offers it) and a fake pool (what it
sends to ranks is recorded); its thread's loop (``run``) is run in the test's own thread over a
script of events, and ends when the script does. No process is started."""

from __future__ import annotations

import collections
import threading
import types

import pytest

from stoker.placements.base import Hung
from stoker.placements.node import wire
from stoker.placements.node.budget import Budget
from stoker.placements.node.group import Group
from stoker.wire import events

pytestmark = pytest.mark.unit

RANK_A, RANK_B = 1001, 1002  # rank processes' pids (their identity in the pool)


class FakeWorkers:
    """What ``Group`` asks of ``LocalProcesses``: processes are slots with a made-up pid; the
    events ``wait`` returns come from ``script`` (a callable in it is called, as the test's
    action between two events); when it runs out the group is closed, and its loop ends."""

    def __init__(self, n: int):
        self.num_workers = n
        self.group: Group | None = None
        self.script: collections.deque = collections.deque()
        self.calls: list = []
        self.views: dict = {}
        self.accept = True  # what send_encoded_task answers
        self.serial: dict = {}  # task number -> whether it was sent to load one at a time
        self._pids = iter(range(5000, 6000))

    def wait(self, timeout):
        while self.script:
            step = self.script.popleft()
            if callable(step):
                step()
                continue
            return step
        self.group.close()
        return None

    def view(self, slot):
        return self.views.get(slot)

    def start(self, slot, config):
        self.calls.append(("start", slot))
        self.views[slot] = types.SimpleNamespace(pid=next(self._pids),
                                                 status={"state": "running", "index": 7})

    def begin_epoch(self, slot, epoch, payload):
        self.calls.append(("begin_epoch", slot, epoch))

    def send_encoded_task(self, slot, number, fmt, payload, serial=False):
        self.calls.append(("task", slot, number, payload))
        self.serial[number] = serial
        return self.accept

    def kill(self, slot, hung):
        self.calls.append(("kill", slot, hung.stuck or hung.index))

    def capture_stack(self, slot):
        return "a stack"

    def shutdown(self):
        self.calls.append(("shutdown",))

    def sent(self) -> list:
        """(slot, task number, payload) of each task sent, in order."""
        return [c[1:] for c in self.calls if c[0] == "task"]


class FakePool:
    job = "test"

    def __init__(self):
        self.tally: collections.Counter = collections.Counter()
        self.out: list = []  # (cid, message)

    def send(self, cid, message, fds=()):
        self.out.append((cid, message))
        return True

    def wake(self):
        pass

    def to(self, cid, kind) -> list:
        return [m for c, m in self.out if c == cid and isinstance(m, kind)]


class FakePending:
    """A slot's batch as the supervisor hands it (``PendingBatch``)."""

    def __init__(self):
        self.offset, self.nbytes, self.fd = 0, 64, -1
        self.discarded = self.lent = False

    def lend(self):
        self.lent = True
        return object()

    def discard(self):
        self.discarded = True


class FakeBoard:
    def __init__(self):
        self.counts: collections.Counter = collections.Counter()
        self.closed = False

    def add(self, name, value=1):
        self.counts[name] += value

    def close(self):
        self.closed = True


def _group(n=2, limit=None):
    pool, workers = FakePool(), FakeWorkers(n)
    config = types.SimpleNamespace(seeder=types.SimpleNamespace(base_seed=0, epoch=0))
    sealed = types.SimpleNamespace(close=lambda: None)
    g = Group(pool, "k" * 64, config, sealed, Budget(limit or n), workers, FakeBoard())
    workers.group = g
    return g, pool, workers


def _task(w, gen, task, index=b"\x01", seed=5, epoch=0, fmt=0, serial=False):
    return wire.Task(w, gen, task, fmt, index, seed, epoch, serial)


def _exited(slot, started=True, signum=9, code=None, task=None):
    return events.WorkerExited(
        worker=slot, pid=1, signum=signum, exit_code=code, cause="was killed",
        explanation="it was killed", index=None, busy=started, hung=False, started=started,
        outside=False, task=task)


def test_nothing_runs_until_start():
    g, _, workers = _group()
    before = threading.active_count()
    assert g._thread.ident is None and threading.active_count() == before
    assert workers.calls == []
    workers.script.append(g.close)  # (the thread's loop ends at once)
    g.start()
    g._thread.join(5)
    assert not g._thread.is_alive()
    g.end()
    assert workers.calls == [("shutdown",)] and g.board.closed


def test_a_task_starts_a_worker_which_takes_it_and_its_batch_goes_to_the_rank():
    g, pool, workers = _group()
    g.attach(1, RANK_A)
    g.add_task(1, _task(0, 1, 10, seed=5, epoch=2))
    # started, set to the task's seed and epoch, given the task
    assert workers.calls[:2] == [("start", 0), ("begin_epoch", 0, 2)]
    (slot, number, payload), = workers.sent()
    assert (slot, payload) == (0, b"\x01")
    assert pool.to(1, wire.Pids) == [wire.Pids((5000,))]
    assert pool.to(1, wire.Began) == [wire.Began(0, 1, 10, 5000)]
    assert g.budget._busy == 1
    pending = FakePending()
    workers.script.append(events.BatchReady(0, number, pending))
    g.run()
    (batch,) = pool.to(1, wire.Batch)
    assert (batch.w, batch.gen, batch.task, batch.pid) == (0, 1, 10, 5000)
    assert pending.lent and not pending.discarded
    assert g.budget._busy == 0 and pool.tally[RANK_A] == 1
    assert g.board.counts["batches_yielded"] == 1


def test_a_task_to_load_one_at_a_time_reaches_the_worker_so():
    g, _, workers = _group()
    g.attach(1, RANK_A)
    g.add_task(1, _task(0, 1, 10))
    g.add_task(1, _task(1, 1, 11, index=b"\x02", serial=True))
    (_, plain, _), (_, serial, _) = workers.sent()
    assert workers.serial == {plain: False, serial: True}


def test_two_ranks_asking_for_the_same_task_get_one_load_and_the_same_batch():
    g, pool, workers = _group()
    g.attach(1, RANK_A)
    g.attach(2, RANK_B)
    g.add_task(1, _task(0, 1, 10))
    g.add_task(2, _task(3, 1, 44))  # (the same seed, epoch and indices: the same batch)
    ((_, number, _),) = workers.sent()
    workers.script.append(events.BatchReady(0, number, FakePending()))
    g.run()
    (a,), (b,) = pool.to(1, wire.Batch), pool.to(2, wire.Batch)
    assert a.bid == b.bid and (a.w, a.task) == (0, 10) and (b.w, b.task) == (3, 44)
    assert pool.tally == {RANK_A: 1, RANK_B: 1}


def test_an_event_of_a_task_the_worker_no_longer_loads_is_dropped():
    g, pool, workers = _group()
    g.attach(1, RANK_A)
    g.add_task(1, _task(0, 1, 10))
    ((_, number, _),) = workers.sent()
    stale = FakePending()
    workers.script.append(events.BatchReady(0, number + 1000, stale))
    g.run()
    assert stale.discarded and pool.to(1, wire.Batch) == []


def test_the_rank_furthest_behind_goes_first():
    g, pool, workers = _group(n=1)
    g.attach(1, RANK_A)
    g.attach(2, RANK_B)
    pool.tally[RANK_A] = 5  # A has received more batches than B
    g.add_task(1, _task(0, 1, 10, index=b"\x01"))  # (taken at once: the only one waiting)
    g.add_task(1, _task(0, 1, 11, index=b"\x02"))
    g.add_task(2, _task(0, 1, 20, index=b"\x03"))
    first = workers.sent()[0][1]
    workers.script.append(events.BatchReady(0, first, FakePending()))
    g.run()
    assert [p for _, _, p in workers.sent()] == [b"\x01", b"\x03"]  # B's before A's second


def test_a_worker_that_dies_on_a_task_is_told_to_its_askers_who_re_issue_the_rest():
    g, pool, workers = _group(n=1)
    g.attach(1, RANK_A)
    g.add_task(1, _task(0, 1, 10, index=b"\x01"))
    g.add_task(1, _task(0, 1, 11, index=b"\x02"))  # (queued: one worker)
    workers.script.extend([
        _exited(0, started=True, task=workers.sent()[0][1]),
        lambda: g.add_task(1, _task(0, 1, 12, index=b"\x03")),  # (sent before the rank heard)
        lambda: g.add_task(1, _task(0, 2, 13, index=b"\x04")),  # (its next incarnation)
    ])
    g.run()
    (died,) = pool.to(1, wire.Died)
    assert (died.w, died.gen, died.exited.worker, died.exited.task) == (0, 1, 0, 10)
    assert died.exited.restartable
    # the rest of that incarnation was forgotten (task 11, and 12 sent before the rank knew):
    # only the next incarnation's task is loaded, by a worker started again
    assert [p for _, _, p in workers.sent()] == [b"\x01", b"\x04"]
    assert [c[0] for c in workers.calls].count("start") == 2


def test_a_worker_that_dies_starting_hands_its_task_to_the_next_one():
    g, pool, workers = _group(n=1)
    g.attach(1, RANK_A)
    g.add_task(1, _task(0, 1, 10))
    workers.script.append(_exited(0, started=False, signum=9))  # (the OOM killer, say)
    g.run()
    assert pool.to(1, wire.Died) == []
    assert [c[0] for c in workers.calls].count("start") == 2  # started again
    assert [p for _, _, p in workers.sent()] == [b"\x01", b"\x01"]


def test_workers_that_keep_failing_to_start_break_the_group():
    g, pool, workers = _group(n=1)
    g.attach(1, RANK_A)
    g.add_task(1, _task(0, 1, 10))
    for _ in range(3):  # (an exception at start-up: the same each time)
        workers.script.append(_exited(0, started=False, signum=0, code=1))
    g.run()
    assert g.broken is not None and not g.broken.restartable
    (died,) = pool.to(1, wire.Died)
    assert not died.exited.restartable
    g.add_task(1, _task(1, 1, 11, index=b"\x09"))  # answered at once with the verdict
    assert [d.w for d in pool.to(1, wire.Died)] == [0, 1]
    assert len(workers.sent()) == 3


def test_a_task_the_worker_could_not_take_waits_for_another():
    g, pool, workers = _group(n=1)
    g.attach(1, RANK_A)
    workers.accept = False  # (its channel is gone: its death is on its way)
    g.add_task(1, _task(0, 1, 10))
    assert g.budget._busy == 0 and pool.to(1, wire.Died) == []
    workers.accept = True
    workers.script.append(_exited(0, started=True))
    g.run()
    assert pool.to(1, wire.Died) == []  # (the death concerned no task of the rank's)
    assert len(workers.sent()) == 2


def test_a_rank_that_leaves_drops_its_tasks_and_a_joined_one_goes_on_for_the_other():
    g, pool, workers = _group(n=1)
    g.attach(1, RANK_A)
    g.attach(2, RANK_B)
    g.add_task(1, _task(0, 1, 10, index=b"\x01"))  # running
    g.add_task(1, _task(0, 1, 11, index=b"\x02"))  # queued for A only
    g.add_task(1, _task(0, 1, 12, index=b"\x03"))  # queued for A and B
    g.add_task(2, _task(0, 1, 22, index=b"\x03"))
    g.detach(1)
    assert g.clients == 1
    workers.script.append(events.BatchReady(0, workers.sent()[0][1], FakePending()))
    g.run()
    assert [p for _, _, p in workers.sent()] == [b"\x01", b"\x03"]
    assert pool.to(1, wire.Batch) == []


def test_a_hang_the_rank_saw_kills_the_worker_loading_its_task():
    g, pool, workers = _group()
    g.attach(1, RANK_A)
    g.add_task(1, _task(0, 1, 10))
    targets = g.kill_targets(1, 0, 1, Hung(None, 30.0, None))
    assert [(slot, h.index) for slot, h in targets] == [(0, 7)]  # (the index it loads now)
    g.kill(targets)
    assert workers.calls[-1] == ("kill", 0, 7)
    assert g.kill_targets(1, 3, 1, Hung(None, 30.0, None)) == []  # nobody loads w 3's task:
    (died,) = pool.to(1, wire.Died)  # it is told of the death at once
    assert died.w == 3


def test_close_gives_back_the_tokens_of_running_tasks():
    g, _, workers = _group()
    g.attach(1, RANK_A)
    g.add_task(1, _task(0, 1, 10, index=b"\x01"))
    g.add_task(1, _task(0, 1, 11, index=b"\x02"))
    assert g.budget._busy == 2
    g.close()
    assert g.budget._busy == 0
    g.add_task(1, _task(0, 1, 12, index=b"\x03"))  # a closed group dispatches nothing
    assert len(workers.sent()) == 2
