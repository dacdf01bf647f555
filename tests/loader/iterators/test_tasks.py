"""The task table on its own (loader/iterators/tasks.py): torch's scheduling, the reorder buffer, what a
death re-issues, changed only through the table's methods. Pure bookkeeping: no processes."""

from __future__ import annotations

import pytest

from stoker.loader.iterators.tasks import NO_BATCH, TaskTable

pytestmark = pytest.mark.unit  # no process (tests/support/tiers.py)


def _fill(t: TaskTable, n: int) -> list[tuple[int, int]]:
    """Sends up to `n` tasks as the iterator does; (task, worker) of each."""
    out = []
    for i in range(n):
        if not t.has_room():
            break
        w = t.pick_worker()
        out.append((t.add(w, [i]), w))
    return out


def test_tasks_go_round_the_workers_as_torchs_do():
    t = TaskTable(3, prefetch_factor=2, in_order=True)
    assert t.max_tasks == 6
    assert [w for _, w in _fill(t, 10)] == [0, 1, 2, 0, 1, 2]
    assert not t.has_room() and t.outstanding == 6
    assert t.in_flight(1) == [1, 4] and t.queued_per_worker() == {0: 2, 1: 2, 2: 2}


def test_only_the_active_limit_takes_tasks():
    t = TaskTable(4, prefetch_factor=1, in_order=True)
    t.set_limit(2)
    assert t.max_tasks == 2
    assert [w for _, w in _fill(t, 5)] == [0, 1]


def test_a_rotation_starts_with_the_given_worker():
    t = TaskTable(3, prefetch_factor=1, in_order=True)
    t.rotate(2)
    assert [w for _, w in _fill(t, 3)] == [2, 0, 1]


def test_results_wait_in_order_and_come_out_in_the_samplers_order():
    t = TaskTable(2, prefetch_factor=2, in_order=True)
    _fill(t, 4)
    # task 1 arrives first: it waits in the reorder buffer behind task 0
    t.accept(1, "result 1")
    assert t.take_ready() is None and t.waiting_on() == 0
    assert t.outstanding == 3 and not t.is_live(1)
    t.accept(0, "result 0")
    first, second = t.take_ready(), t.take_ready()
    assert (first.number, first.worker, first.result) == (0, 0, "result 0")
    assert (second.number, second.worker, second.result) == (1, 1, "result 1")
    assert t.take_ready() is None and t.next_to_hand_out == 2 and t.is_live(2)
    assert t.held_by(0) == 1 and t.held_by(1) == 1 and not t.finished()


def test_out_of_order_results_come_out_as_they_arrive():
    t = TaskTable(2, prefetch_factor=1, in_order=False)
    _fill(t, 2)
    t.accept(1, "result 1")
    task = t.take_ready()
    assert (task.number, task.result) == (1, "result 1") and t.take_ready() is None
    t.accept(0, "result 0")
    assert t.take_ready().number == 0 and t.finished()


def test_a_result_is_taken_once():
    t = TaskTable(1, prefetch_factor=1, in_order=True)
    _fill(t, 1)
    t.accept(0, "result 0")
    with pytest.raises(AssertionError):
        t.accept(0, "a late duplicate")


def test_an_ended_stream_frees_the_places_of_tasks_it_will_never_answer():
    t = TaskTable(2, prefetch_factor=2, in_order=True)
    _fill(t, 4)  # worker 0 has tasks 0 and 2, worker 1 has 1 and 3
    t.retire(0)
    assert t.outstanding == 2 and t.in_flight(0) == [] and t.has_room()
    assert not t.is_active(0) and t.taking() == [1] and not t.is_live(0)
    # the tasks of the ended worker are skipped when their turn comes
    assert t.take_ready() is None and t.waiting_on() == 1 and t.next_to_hand_out == 1
    t.accept(1, "result 1")
    t.accept(3, "result 3")
    assert [t.take_ready().number, t.take_ready().number] == [1, 3] and t.finished()


def test_a_reissued_task_forgets_its_skips_and_may_move():
    t = TaskTable(2, prefetch_factor=2, in_order=True)
    _fill(t, 2)
    t.add_skips(0, [(0, "flaky")])
    t.reissue(0, [0], worker_id=1)
    assert t.take_skips(0) == [] and t.in_flight(1) == [0, 1]
    assert t.held_by(0) == 0 and t.held_by(1) == 2
    t.add_skips(1, [(1, "bad")])
    t.reissue(1, NO_BATCH)  # every sample of it quarantined meanwhile
    assert t.index_of(1) is NO_BATCH and t.take_skips(1) == []


def test_indices_of_tasks_for_a_death_report():
    t = TaskTable(1, prefetch_factor=3, in_order=True)
    t.add(0, [1, 2])
    t.add(0, 7)
    t.add(0, NO_BATCH)
    assert t.indices_of([0, 1, 2]) == [1, 2, 7]


def test_every_epoch_starts_empty_and_drain_hands_back_what_waits():
    t = TaskTable(2, prefetch_factor=1, in_order=True)
    _fill(t, 2)
    t.accept(1, "late")
    t.accept(0, NO_BATCH)
    assert sorted(map(repr, t.drain())) == ["'late'", "NO_BATCH"] and t.finished()
    t.reset()
    assert t.sent == t.next_to_hand_out == t.outstanding == 0 and t.take_ready() is None
    assert t.finished()


def test_out_of_order_delivery_balances_by_tasks_held():
    """in_order=False: a worker already holding its share is passed over (torch's rule)."""
    t = TaskTable(2, prefetch_factor=1, in_order=False)
    assert t.pick_worker() == 0
    t.add(0, [0])
    assert t.pick_worker() == 1
    t.add(1, [1])
    assert t.pick_worker() is None
