"""stoker.placements.node.records: a pool worker's start-up deaths, which pause its restarts and
break its group; a rank's queue and forgotten incarnations. No process."""

from __future__ import annotations

import time

import pytest

from stoker.placements.node import records
from stoker.placements.node.records import Asker, Client, PoolWorker, Task, breaks_group

pytestmark = pytest.mark.unit


def test_three_start_up_exceptions_in_a_row_break_the_group_and_an_outcome_resets_them():
    pw = PoolWorker(0)
    for _ in range(2):
        pw.started(1, (0, 0))
        pw.ended(started=False, signalled=False)
    assert not breaks_group([pw], time.monotonic())
    pw.loaded()  # it loaded something since: the count starts again
    for _ in range(2):
        pw.ended(started=False, signalled=False)
    assert not breaks_group([pw], time.monotonic())
    pw.ended(started=False, signalled=False)
    assert breaks_group([pw], time.monotonic())


def test_kills_at_start_up_pause_restarts_and_break_only_without_progress():
    pws = [PoolWorker(0), PoolWorker(1)]
    for i in range(records.START_KILLS_BROKEN):
        pws[i % 2].ended(started=False, signalled=True)
    assert pws[0].start_kills == 5 and not pws[0].startable(time.monotonic())  # (a pause)
    assert pws[0].startable(time.monotonic() + 2.0)
    assert not breaks_group(pws, time.monotonic())  # (progress just now)
    assert breaks_group(pws, time.monotonic() - records.STARTUP_GRACE_S - 1)


def test_a_worker_that_ends_gives_back_its_task_and_is_idle_only_when_alive():
    pw = PoolWorker(0)
    assert not pw.idle() and pw.startable(time.monotonic())
    pw.started(42, (1, 2))
    assert pw.idle() and (pw.pid, pw.seed) == (42, (1, 2))
    t = Task((1, 2, 0, b""), 0, b"", [])
    pw.task = t
    assert not pw.idle()
    assert pw.ended(started=True, signalled=True) is t
    assert (pw.alive, pw.pid, pw.task) == (False, None, None)


def test_a_clients_queue_skips_tasks_nobody_wants_and_it_forgets_incarnations():
    c = Client(1, 11)
    unwanted = Task((0, 0, 0, b"a"), 0, b"a", [])
    wanted = Task((0, 0, 0, b"b"), 0, b"b", [Asker(1, 0, 1, 5)])
    c.queue.extend([unwanted, wanted])
    assert c.head() is wanted and list(c.queue) == [wanted]
    c.forgotten[0] = 2
    assert c.forgot(0, 1) and c.forgot(0, 2) and not c.forgot(0, 3) and not c.forgot(1, 0)
    assert Asker(1, 0, 2, 5).of(1, 0, 2) and not Asker(1, 0, 3, 5).of(1, 0, 2)
