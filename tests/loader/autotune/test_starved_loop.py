"""num_workers="auto" and the kernel's run queue (issue 50): time the main process and the
workers waited for a CPU counts as CPU (a machine whose CPUs are taken has no core free, and
workers on the run queue do not wait on I/O), and a training loop that did not wait for data but
for a CPU sheds the workers it does not need (they took its cores), when they compute; a
worker's cost is per batch it sent (the first look: their queues fill), its CPU the kernel's
schedstat, to the nanosecond. Synthetic windows, and the measure read from a fake placement: no
process."""

from __future__ import annotations

import pytest

from stoker.loader.autotune import measure as _measure
from stoker.loader.autotune import tuner as _autotune
from stoker.loader.autotune import window as _windows
from stoker.placements.base import WorkerView

pytestmark = pytest.mark.unit  # no process (tests/support/tiers.py)


def _window(stall=0.0, busy=None, main_cpu=0.5, main_rq=0.0, worker_cpu=0.5, worker_rq=0.0,
            cpus=2, batches=0, first=False, seconds=1.0, made=0):
    """Shares of a window of `seconds`; the workers busy as long as they were on a CPU or
    waiting for one (they compute) unless `busy` says otherwise."""
    busy = worker_cpu + worker_rq if busy is None else busy
    return _windows.Window(
        seconds=seconds, waited_s=stall * seconds, main_cpu_s=main_cpu * seconds,
        worker_cpu_s=worker_cpu * seconds, worker_busy_s=busy * seconds, usable_cpus=cpus,
        worker_rss=100 << 20, slot_bytes_per_worker=0, memory_headroom=None, memory_limit=None,
        batches=batches, made=made, first=first, main_runqueue_s=main_rq * seconds,
        worker_runqueue_s=worker_rq * seconds)


def _run(tuner, windows):
    return [tuner.decide(w, batch) for batch, w in enumerate(windows)]


# -- a core is free only when nothing of ours waits for one -----------------------------------------
def test_time_on_the_run_queue_leaves_no_core_free():
    # the loop waits for data; on a CPU 1.0 of 4 CPUs: 3 look free, and a worker is added
    t = _autotune.Tuner(bound=8, initial=2)
    assert t.decide(_window(stall=0.5, main_cpu=0.5, worker_cpu=0.5, cpus=4), 1) == 3
    # the same, but the workers and the loop waited for a CPU 2.5 s a second: none is free
    t = _autotune.Tuner(bound=8, initial=2)
    assert _run(t, [_window(stall=0.5, main_cpu=0.5, worker_cpu=0.5, worker_rq=2.0,
                            main_rq=0.5, cpus=4)] * 4) == [2] * 4
    t = _autotune.Tuner(bound=8, initial=2)  # (the main process's own run queue counts too)
    assert _run(t, [_window(stall=0.5, main_cpu=0.5, worker_cpu=0.5, main_rq=2.5,
                            cpus=4)] * 4) == [2] * 4


# -- a loop starved of CPU -----------------------------------------------------------------------------
def test_keeping_pace_counts_the_workers_that_need_no_more_cpu_a_batch_than_the_loop():
    assert _windows.keeping_pace(_window(main_cpu=0.5, worker_cpu=0.5, main_rq=0.2)) == 1
    # (give or take STARVED: one that needs 10% more than the loop keeps pace)
    assert _windows.keeping_pace(_window(main_cpu=0.5, worker_cpu=0.55, main_rq=0.2)) == 1
    assert _windows.keeping_pace(_window(main_cpu=0.5, worker_cpu=0.56, main_rq=0.2)) == 2
    assert _windows.keeping_pace(_window(main_cpu=0.2, worker_cpu=0.9, main_rq=0.2)) == 5
    assert _windows.keeping_pace(_window(main_cpu=0.5, worker_cpu=0.01, main_rq=0.2)) == 1
    # a loop that did not wait for a CPU (STARVED of the window at least) is not starved
    assert _windows.STARVED == 0.1
    assert _windows.keeping_pace(_window(main_cpu=0.5, worker_cpu=0.5, main_rq=0.1)) == 1
    assert _windows.keeping_pace(_window(main_cpu=0.5, worker_cpu=0.5, main_rq=0.099)) > 1000
    assert _windows.keeping_pace(_window(main_cpu=0.0, worker_cpu=0.5, main_rq=0.5)) > 1000
    # workers that mostly wait (on a CPU or its run queue less than half their busy time: on
    # the network) take little of its CPU, and their CPU says nothing of their pace: none retire
    assert _windows.keeping_pace(_window(main_cpu=0.5, worker_cpu=0.1, worker_rq=0.05,
                                          main_rq=0.2, busy=0.31)) > 1000
    assert _windows.keeping_pace(_window(main_cpu=0.5, worker_cpu=0.1, worker_rq=0.05,
                                          main_rq=0.2, busy=0.3)) == 1


def test_a_loop_starved_of_cpu_sheds_a_worker_after_two_windows():
    # 2 workers on 2 CPUs with a training step that computes: the loop never waits for data
    # but waits for a CPU 20% of the time, and one worker needs no more CPU a batch than it
    t = _autotune.Tuner(bound=2, initial=2)
    starved = _window(stall=0.01, main_cpu=0.8, main_rq=0.2, worker_cpu=0.75, busy=1.0)
    assert _run(t, [starved] * 3) == [2, 1, 1]
    assert t.reason.startswith("2 -> 1 workers: the training loop waited for a CPU 20% of the "
                               "time (for data 1.0%), and 1 workers keep pace with it"), t.reason
    assert [d.active for d in t.decisions] == [2, 1]


def test_a_starved_loop_keeps_the_workers_it_needs():
    # each of 2 workers would need more CPU a batch than the loop: 3 keep pace, 3 stay
    t = _autotune.Tuner(bound=4, initial=3)
    assert _run(t, [_window(stall=0.01, main_cpu=0.4, main_rq=0.3, worker_cpu=1.0)] * 4) == [3] * 4
    # a loop that waits for data is not shed from, whatever its run queue
    t = _autotune.Tuner(bound=4, initial=2)
    assert _run(t, [_window(stall=0.06, main_cpu=0.8, main_rq=0.5, worker_cpu=0.2, cpus=2)
                    ] * 4) == [2] * 4
    # one starved window between two calm ones: nothing
    t = _autotune.Tuner(bound=2, initial=2)
    calm = _window(stall=0.01, main_cpu=0.8, main_rq=0.0, worker_cpu=0.75, busy=1.4)
    starved = _window(stall=0.01, main_cpu=0.8, main_rq=0.2, worker_cpu=0.75, busy=1.4)
    assert _run(t, [starved, calm, starved, calm]) == [2] * 4
    # never below one worker
    t = _autotune.Tuner(bound=2, initial=1)
    assert _run(t, [starved] * 4) == [1] * 4


def test_the_first_look_goes_straight_to_the_workers_that_keep_pace_with_a_starved_loop():
    # 3 workers busy 1.2 worker-seconds a second: 2 keep up (``needed``), and 2 keep pace
    t = _autotune.Tuner(bound=4, initial=3)
    w = _window(stall=0.0, main_cpu=0.6, main_rq=0.3, worker_cpu=1.2, batches=4, first=True,
                seconds=0.05, cpus=4)
    assert (_windows.keeping_pace(w), _windows.needed(w)) == (2, 2)
    assert t.decide(w, 5) == 2
    assert t.reason.startswith("3 -> 2 workers at the first look: the training loop waited for "
                               "a CPU 30% of the time (for data 0.0%), and 2 keep pace with it"
                               ), t.reason
    # 2 would keep pace, but 1 keeps up (busy half the time): the second only takes the loop's
    # CPU (a short epoch with a 3 ms step on 2 CPUs: fixed 1 worker 1.2-1.4x fixed 2, and
    # "auto", which kept 2 where one batch's CPU said 2 keep pace, 0.79 of fixed 1)
    t = _autotune.Tuner(bound=4, initial=3)
    w = _window(stall=0.0, main_cpu=0.4, main_rq=0.3, worker_cpu=0.5, batches=4, first=True,
                seconds=0.05)
    assert (_windows.keeping_pace(w), _windows.needed(w)) == (2, 1)
    assert t.decide(w, 5) == 1
    assert t.reason.startswith("3 -> 1 workers at the first look: the training loop waited for "
                               "a CPU 30% of the time (for data 0.0%), and 1 keep up with it "
                               "within the 2 CPUs"), t.reason
    # not starved (on the run queue less than STARVED of the window): nothing shed
    t = _autotune.Tuner(bound=4, initial=3)
    assert t.decide(_window(stall=0.0, main_cpu=0.4, main_rq=0.05, worker_cpu=0.5, batches=4,
                            first=True, seconds=0.05), 5) == 3
    # at the bound too (2 CPUs, 2 workers): one fewer
    t = _autotune.Tuner(bound=2, initial=2)
    assert t.decide(_window(stall=0.02, main_cpu=0.5, main_rq=0.5, worker_cpu=0.4, batches=4,
                            first=True), 5) == 1
    # a loop that waited for data at the first look is given workers, not shed
    t = _autotune.Tuner(bound=4, initial=2)
    assert t.decide(_window(stall=0.9, main_cpu=0.05, main_rq=0.3, worker_cpu=0.5, busy=1.0,
                            batches=100, first=True, cpus=4), 5) == 4


# -- the measure ---------------------------------------------------------------------------------------
class _Workers:
    def __init__(self):
        # worker 0: its placement reads the kernel's schedstat (CPU, run queue); worker 1's
        # cannot (the view's CPU, in ticks, and no run queue)
        self.sched = {0: (4.0, 1.0), 1: None}
        self.cpu = {0: 99.0, 1: 2.0}
        self.sent = {0: 10, 1: 20}

    def view(self, w):
        return WorkerView(100 + w, 0.0, 0.0, self.cpu[w], False, {
            "seconds_in": {"loading": 1.0, "collating": 0.0, "encoding": 0.0}, "rss_bytes": 1,
            "batches": self.sent[w]})

    def schedstat_of(self, w):
        return self.sched[w]

    def slot_usage(self):
        return {}


class _Stats:
    waited_s = 0.0
    yielded = 0


def test_the_measure_reads_the_run_queue_of_the_loop_and_of_the_workers(monkeypatch):
    main = [3.0]
    monkeypatch.setattr(_measure._system, "runqueue_seconds", lambda: main[0])
    workers = _Workers()
    m = _measure.Measure(_Stats(), workers, usable_cpus=2)
    m.restart([0, 1])
    main[0], workers.sched[0] = 3.5, (4.0, 1.75)
    w = m.window([0, 1])
    assert w.main_runqueue_s == 0.5 and w.worker_runqueue_s == 0.75
    main[0], workers.sched[0] = 3.25, (4.0, 1.0)  # (a thread ended: its time left the sum)
    w = m.window([0, 1])
    assert w.main_runqueue_s == 0.0 and w.worker_runqueue_s == 0.0
    monkeypatch.setattr(_measure._system, "runqueue_seconds", lambda: None)  # no schedstat
    m.restart([0, 1])
    assert m.window([0, 1]).main_runqueue_s == 0.0


def test_the_measure_takes_a_workers_cpu_from_schedstat_where_it_has_one(monkeypatch):
    monkeypatch.setattr(_measure._system, "runqueue_seconds", lambda: 0.0)
    workers = _Workers()
    m = _measure.Measure(_Stats(), workers, usable_cpus=2)
    m.restart([0, 1])
    # worker 0: 0.0125 s more by schedstat (its view's ticks say 0.01 more: not read);
    # worker 1: 0.02 more by its view (no schedstat)
    workers.sched[0], workers.cpu[0], workers.cpu[1] = (4.0125, 1.0), 99.01, 2.02
    workers.sent = {0: 13, 1: 25}  # the batches they sent, from their status pages
    w = m.window([0, 1])
    assert w.worker_cpu_s == pytest.approx(0.0325) and w.made == 8


def test_a_workers_cost_is_per_batch_it_sent():
    # the first look: the loop took 4 batches (3.7 ms of CPU each) while its 2 workers, filling
    # their queues, sent 8 for 20 ms of CPU: 2.5 ms a batch, and one keeps pace with the loop
    # (shares of a 50 ms window)
    w = _window(stall=0.0, main_cpu=0.296, main_rq=0.4, worker_cpu=0.4, batches=4, made=8,
                first=True, seconds=0.05)
    assert _windows.keeping_pace(w) == 1
    t = _autotune.Tuner(bound=2, initial=2)
    assert t.decide(w, 5) == 1
    assert "a batch takes a worker 2.5 ms of CPU, the loop 3.7 ms" in t.reason, t.reason
    w.made = 0  # (unknown: per batch the loop took, 5 ms: 2 to keep pace)
    assert _windows.keeping_pace(w) == 2
    assert _windows.needed(w) == 1  # (but one keeps up, busy 40% of the time)


def test_a_wait_for_data_while_the_workers_queues_filled_is_their_start():
    # the first look: the loop waited for data 30% of the window, but its 2 workers sent 8
    # batches while it took 4 (a batch each more: their queues filled): it waited for their
    # start, and for a CPU 40%; one keeps pace with it
    def first(made):
        return _window(stall=0.3, main_cpu=0.296, main_rq=0.4, worker_cpu=0.4, batches=4,
                       made=made, first=True, seconds=0.05)

    t = _autotune.Tuner(bound=2, initial=2)
    assert t.decide(first(made=6), 5) == 1 and "waited for a CPU 40%" in t.reason, t.reason
    # a batch more in all: the loop was short of data, not of a CPU
    t = _autotune.Tuner(bound=2, initial=2)
    assert t.decide(first(made=5), 5) == 2
    assert [d.active for d in t.decisions] == [2]


def test_the_count_needed_takes_a_workers_busy_time_per_batch_it_sent():
    # the loop took 100 batches, 1 ms of its own each, and waited the rest of the second; the
    # workers were busy 1 s (all CPU): 10 ms a batch taken, 10 workers needed to keep up...
    w = _window(stall=0.9, main_cpu=0.1, worker_cpu=1.0, batches=100, first=True, cpus=16)
    assert _windows.needed(w) == 10
    # ...but they sent 200 (their queues filled): 5 ms a batch, and 5 keep up
    w.made = 200
    assert _windows.needed(w) == 5


def test_a_starved_loop_is_given_no_more_workers_that_compute_than_keep_pace():
    # the first look of a loader that starts at 1 worker, on 2 CPUs with a core free: the loop
    # waited for data 26% (the worker's start) and for a CPU 12%; a batch takes the worker
    # 3 ms of CPU and 6.1 ms busy, the loop 3 ms: one keeps pace, and needed() would say 2
    # (busy time per batch over the loop's step)
    def first(main_rq):
        return _window(stall=0.26, main_cpu=0.4, main_rq=main_rq, worker_cpu=0.5,
                       worker_rq=0.05, busy=1.02, batches=4, made=5, first=True, seconds=0.03)

    assert _windows.needed(first(0.12)) == 2 and _windows.keeping_pace(first(0.12)) == 1
    t = _autotune.Tuner(bound=2, initial=1)
    assert t.decide(first(0.12), 5) == 1 and [d.active for d in t.decisions] == [1]
    # the same costs, the loop not starved (its run queue under STARVED): needed() decides
    t = _autotune.Tuner(bound=2, initial=1)
    assert t.decide(first(0.09), 5) == 2


def test_the_first_look_adds_no_worker_without_a_free_core():
    # one worker on 2 CPUs; the loop waited for data 46% of the window (not for a CPU), and
    # the worker waited for a CPU half the time it was busy: the loop, the worker and their
    # run queue took 1.6 of the 2 CPUs, none is free (as for one more worker later); needed()
    # over the 2 usable CPUs would say 2
    def first(worker_rq):
        return _window(stall=0.46, main_cpu=0.5, main_rq=0.06, worker_cpu=0.5,
                       worker_rq=worker_rq, batches=4, made=4, first=True, seconds=0.03)

    assert _windows.needed(first(0.52)) == 2
    t = _autotune.Tuner(bound=2, initial=1)
    assert t.decide(first(0.52), 5) == 1 and [d.active for d in t.decisions] == [1]
    # a core free (the worker hardly waited for one): 2
    t = _autotune.Tuner(bound=2, initial=1)
    assert t.decide(first(0.1), 5) == 2
