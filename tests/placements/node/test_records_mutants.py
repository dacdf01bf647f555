"""stoker.placements.node.records: the records a node group keeps (pool workers, clients,
tasks)."""

from __future__ import annotations

import collections
import time

import pytest

from stoker.placements.base import STARTUP_GRACE_S
from stoker.placements.node import records
from stoker.placements.node.records import Asker, Client, PoolWorker, Task, breaks_group

pytestmark = pytest.mark.unit  # no process (tests/support/tiers.py)


def test_an_asker_is_of_its_virtual_worker_up_to_its_incarnation():
    a = Asker(cid=1, w=2, gen=3, task=7)
    assert a.of(1, 2, 3) is True
    assert a.of(1, 2, 4) is True  # a later incarnation forgets the earlier's requests too
    assert a.of(1, 2, 2) is False
    assert a.of(0, 2, 3) is False
    assert a.of(1, 0, 3) is False
    assert a == Asker(1, 2, 3, 7) and hash(a) == hash(Asker(1, 2, 3, 7))


def test_tasks_are_numbered_in_order_and_compared_by_identity():
    t1 = Task(("s", 1, 0, b""), 0, b"", [])
    t2 = Task(("s", 1, 0, b""), 0, b"", [])
    assert t2.number == t1.number + 1
    assert t1 != t2
    assert (t1.worker, t1.began, t1.sent_at, t1.killed, t1.one_at_a_time) == (
        None, False, 0.0, False, False)


def test_a_task_says_how_long_it_waited_since_it_was_sent():
    t = Task((), 0, b"", [])
    t.sent_at = time.monotonic() - 5.0
    assert 5.0 <= t.waited() < 60.0


def test_a_pool_worker_is_idle_only_alive_not_lost_and_without_a_task():
    pw = PoolWorker(0)
    assert (pw.alive, pw.lost, pw.pid, pw.task, pw.seed) == (False, False, None, None, None)
    assert (pw.start_deaths, pw.start_kills, pw.restart_at) == (0, 0, 0.0)
    assert not pw.idle()
    pw.started(123, (5, 1))
    assert (pw.alive, pw.lost, pw.pid, pw.seed) == (True, False, 123, (5, 1))
    assert pw.idle()
    pw.lost = True
    assert not pw.idle()
    pw.started(124, (5, 2))  # a new process: no longer lost
    assert pw.idle() and pw.pid == 124
    pw.task = Task((), 0, b"", [])
    assert not pw.idle()


def test_a_pool_worker_is_startable_when_dead_and_its_pause_is_over():
    pw = PoolWorker(0)
    now = time.monotonic()
    assert pw.startable(now)
    pw.restart_at = now
    assert pw.startable(now)  # (at the very moment)
    pw.restart_at = now + 1
    assert not pw.startable(now)
    assert pw.startable(now + 1)
    pw.restart_at = 0.0
    pw.alive = True
    assert not pw.startable(now)


def test_an_end_returns_the_task_and_clears_the_process():
    pw = PoolWorker(3)
    pw.started(10, (1, 1))
    task = Task((), 0, b"", [])
    pw.task, pw.lost = task, True
    assert pw.ended(started=True, signalled=False) is task
    assert (pw.task, pw.alive, pw.lost, pw.pid) == (None, False, False, None)
    assert (pw.start_deaths, pw.start_kills, pw.restart_at) == (0, 0, 0.0)  # past start-up
    assert pw.ended(started=True, signalled=True) is None
    assert (pw.start_deaths, pw.start_kills) == (0, 0)


def test_deaths_at_start_up_are_counted_by_kind():
    pw = PoolWorker(0)
    pw.ended(started=False, signalled=False)
    pw.ended(started=False, signalled=False)
    assert (pw.start_deaths, pw.start_kills) == (2, 0)
    pw.ended(started=False, signalled=True)
    assert (pw.start_deaths, pw.start_kills) == (2, 1)
    assert pw.restart_at == 0.0  # no pause for the first kills
    pw.loaded()
    assert (pw.start_deaths, pw.start_kills, pw.task) == (0, 0, None)


def test_a_pause_grows_from_the_fourth_kill_in_a_row_up_to_two_seconds():
    pw = PoolWorker(0)
    for _ in range(3):
        pw.ended(started=False, signalled=True)
    assert pw.restart_at == 0.0
    pauses = []
    for _ in range(8):
        before = time.monotonic()
        pw.ended(started=False, signalled=True)
        after = time.monotonic()
        lo, hi = pw.restart_at - after, pw.restart_at - before
        pauses.append((lo, hi))
    expected = [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0]
    for (lo, hi), want in zip(pauses, expected):
        assert lo <= want + 1e-9 and want <= hi + 1e-9, (pauses, expected)
    pw.ended(started=True, signalled=True)  # (kills stay counted until it loads something)
    assert pw.start_kills == 11
    pw.loaded()
    assert pw.start_kills == 0


def test_loaded_clears_the_task():
    pw = PoolWorker(0)
    pw.task = Task((), 0, b"", [])
    pw.start_deaths = 2
    pw.loaded()
    assert pw.task is None and pw.start_deaths == 0


def test_three_deaths_at_start_up_in_a_row_break_the_group():
    assert records.START_DEATHS_BROKEN == 3 and records.START_KILLS_BROKEN == 10
    a, b = PoolWorker(0), PoolWorker(1)
    now = time.monotonic()
    assert not breaks_group([a, b], now)
    a.start_deaths = 2
    b.start_deaths = 2
    assert not breaks_group([a, b], now)  # counted per worker, not summed
    b.start_deaths = 3
    assert breaks_group([a, b], now)
    assert breaks_group([b], now)
    assert not breaks_group([], now)


def test_kills_break_the_group_only_after_the_grace_without_progress():
    a, b = PoolWorker(0), PoolWorker(1)
    a.start_kills, b.start_kills = 5, 5  # 10 in all
    now = time.monotonic()
    assert not breaks_group([a, b], now)  # progress just now
    assert breaks_group([a, b], now - STARTUP_GRACE_S - 1)
    b.start_kills = 4  # 9
    assert not breaks_group([a, b], now - STARTUP_GRACE_S - 1)
    b.start_kills = 5
    assert not breaks_group([a, b], now - STARTUP_GRACE_S + 5)


def test_a_client_forgets_incarnations_up_to_the_one_that_died():
    c = Client(cid=1, rank=99)
    assert isinstance(c.queue, collections.deque) and c.forgotten == {}
    assert not c.forgot(0, 0)
    c.forgotten[0] = 2
    assert c.forgot(0, 0) and c.forgot(0, 2)
    assert not c.forgot(0, 3)
    assert not c.forgot(1, 0)
    c.forgotten[1] = 0
    assert c.forgot(1, 0) and not c.forgot(1, 1)
    assert Client(1, 1) != Client(1, 1)  # (compared by identity)


def test_a_clients_head_skips_tasks_nobody_wants():
    c = Client(1, 1)
    assert c.head() is None
    dead, alive = Task((), 0, b"", []), Task((), 0, b"", [Asker(1, 0, 0, 0)])
    c.queue.extend([dead, alive, Task((), 0, b"", [])])
    assert c.head() is alive
    assert list(c.queue)[0] is alive and len(c.queue) == 2  # only what is before it dropped
    alive.askers.clear()
    assert c.head() is None and not c.queue


@pytest.mark.parametrize("started", [True, False])
def test_ended_twice_returns_nothing_the_second_time(started):
    pw = PoolWorker(0)
    pw.task = Task((), 0, b"", [])
    assert pw.ended(started, False) is not None
    assert pw.ended(started, False) is None


class _Clock:
    def __init__(self, now):
        self.now = now

    def monotonic(self):
        return self.now


def test_the_grace_is_exclusive(monkeypatch):
    clock = _Clock(1000.0)
    monkeypatch.setattr(records, "time", clock)
    a = PoolWorker(0)
    a.start_kills = 10
    assert not breaks_group([a], 1000.0 - STARTUP_GRACE_S)  # exactly the grace: not yet
    assert breaks_group([a], 1000.0 - STARTUP_GRACE_S - 0.001)
