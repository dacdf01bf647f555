"""The task table on its own (iterators/tasks.py): torch's scheduling, the reorder buffer, what a
death re-issues. Pure bookkeeping: no processes."""

from __future__ import annotations

from stoker.iterators.tasks import NO_BATCH, TaskTable


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
    t.limit = 2
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
    t.received(1)
    t.info[1].append("result 1")
    assert t.worker_of_next() == (0, False)
    t.received(0)
    t.info.pop(0)
    t.rcvd_idx += 1
    assert t.worker_of_next() == (1, True)
    assert t.take_next() == (1, 1, "result 1")
    assert t.rcvd_idx == 2 and t.is_live(2) and not t.is_live(1)


def test_an_ended_stream_frees_the_places_of_tasks_it_will_never_answer():
    t = TaskTable(2, prefetch_factor=2, in_order=True)
    _fill(t, 4)  # worker 0 has tasks 0 and 2, worker 1 has 1 and 3
    t.active[0] = False
    t.ended(0)
    assert t.outstanding == 2 and t.in_flight(0) == [] and t.has_room()
    # the tasks of the ended worker are skipped when their turn comes
    assert t.worker_of_next() == (1, False) and t.rcvd_idx == 1


def test_indices_of_tasks_for_a_death_report():
    t = TaskTable(1, prefetch_factor=3, in_order=True)
    t.add(0, [1, 2])
    t.add(0, 7)
    t.add(0, NO_BATCH)
    assert t.indices_of([0, 1, 2]) == [1, 2, 7]


def test_every_epoch_starts_empty_and_drain_hands_back_what_waits():
    t = TaskTable(2, prefetch_factor=1, in_order=True)
    _fill(t, 2)
    t.info[1].append("late")
    t.synthetic.append((0, NO_BATCH))
    assert list(t.drain()) == ["late"] and not t.synthetic
    t.reset()
    assert t.send_idx == t.rcvd_idx == t.outstanding == 0 and t.worker_of_next() is None


def test_out_of_order_delivery_balances_by_tasks_held():
    """in_order=False: a worker already holding its share is passed over (torch's rule)."""
    t = TaskTable(2, prefetch_factor=1, in_order=False)
    assert t.pick_worker() == 0
    t.add(0, [0])
    assert t.pick_worker() == 1
    t.add(1, [1])
    assert t.pick_worker() is None
