"""stoker.worker.inflight: what "auto" counts as computing and how far it widens a worker that
computes (issue 50): time on the run queue (runnable, every CPU taken) is computing; with the GIL
a worker that computes stays at one thread; without it (free-threaded Python) it doubles from one
thread while its samples per second rise, up to its share of the CPUs (``LoadSettings.cpus``).
Made-up batch timings and readings: no clock, no process."""

from __future__ import annotations

import pytest

from stoker.config.load import LoadSettings
from stoker.worker import inflight
from stoker.worker.inflight import InFlight, Width

pytestmark = pytest.mark.unit  # no process (tests/support/tiers.py)


def _first(w: Width, cpu_s: float, runqueue_s: float = 0.0, size: int = 1000) -> Width:
    """`w`'s first width (8) seen fresh, then judged over one batch of 1 s."""
    w.observe(size, 1.0, 0.01)  # (fresh)
    w.observe(size, 1.0, cpu_s, runqueue_s)
    return w


# -- the run queue ------------------------------------------------------------------------------
def _alone(w: Width, cpu_share: float, runqueue_share: float = 0.0, wall_s: float = 1.0):
    """`w`'s width now seen fresh, then judged over one batch of 1000 samples in `wall_s`."""
    w.observe(1000, 1.0, 0.01)  # (fresh)
    w.observe(1000, wall_s, cpu_share * wall_s, runqueue_share * wall_s)


def test_a_worker_on_a_cpu_at_its_first_width_goes_to_one_thread_at_once():
    w = _first(Width("auto", gil=True), 0.6, 0.0)
    assert (w.now, w.settled) == (1, True)


def test_time_on_the_run_queue_is_computing_and_one_thread_alone_confirms_it():
    # on a CPU 30% of the time and runnable, waiting for one, 50%: it computes on a busy
    # machine, or its many threads that wait each woke late: one thread alone says which
    w = _first(Width("auto", gil=True), 0.3, 0.5)
    assert (w.now, w.settled) == (1, False)
    _alone(w, 0.3, 0.65)  # alone, it is still on a CPU or waiting for one: it computes
    assert (w.now, w.settled) == (1, True)
    w.observe(1000, 1.0, 0.01)
    assert w.now == 1
    # the same CPU without the run queue: it waits, and widens by the share it waited
    w = _first(Width("auto", gil=True), 0.3, 0.0)
    assert (w.now, w.settled) == (16, False)


def test_threads_that_wait_on_io_on_a_busy_machine_widen_again_from_one_thread():
    # 8 threads that wait on the network, each woken late on a busy machine: their run queue
    # adds up to more than the wall time
    w = _first(Width("auto", gil=True), 0.2, 1.8)
    assert (w.now, w.settled) == (1, False)
    _alone(w, 0.02, 0.1)  # one thread alone mostly sleeps: it waits (0.8 / 0.12: 6 times)
    assert (w.now, w.settled) == (6, False)
    _alone(w, 0.1, 0.5, wall_s=1 / 6)  # 6 times the samples per second; it computes now: with
    assert (w.now, w.settled) == (12, False)  # its CPU busy, a doubling, as a waiting one's
    _alone(w, 0.9, 0.0, wall_s=1 / 6)  # the doubling did not pay: back to 6
    assert (w.now, w.settled) == (6, True)


def test_the_run_queue_counts_at_the_waiting_share():
    w = _first(Width("auto", gil=True), 0.2, 0.4)  # exactly 0.6 of the wall time: computing
    assert (w.now, w.settled) == (1, False)
    w = _first(Width("auto", gil=True), 0.2, 0.39)  # just below: waiting
    assert w.now > 8


def test_a_negative_run_queue_reading_counts_as_none():
    w = _first(Width("auto", gil=True), 0.5, -0.4)  # (a thread ended between two readings)
    assert w.now == 16  # 0.5 of the wall time: waiting, not 0.1


def test_the_run_queue_jumps_less_far():
    # a worker that waits: the jump is by the share it was neither on a CPU nor waiting for one
    w = _first(Width("auto", gil=True), 0.05, 0.05)  # 0.8 / 0.1 = 8 times
    assert w.now == 64


# -- the GIL ---------------------------------------------------------------------------------------
def test_with_the_gil_a_worker_that_computes_stays_at_one_thread_whatever_its_cpus():
    w = _first(Width("auto", cpus=16, gil=True), 0.9)
    assert (w.now, w.settled) == (1, True)
    w.observe(1000, 1.0, 0.9)
    assert w.now == 1


def test_the_gil_is_this_interpreters_unless_given(monkeypatch):
    monkeypatch.setattr(inflight._system, "gil_enabled", lambda: False)
    assert Width("auto").gil is False
    monkeypatch.setattr(inflight._system, "gil_enabled", lambda: True)
    assert Width("auto").gil is True
    assert Width("auto", gil=False).gil is False


def _climbing(cpus: int) -> Width:
    """No GIL, `cpus` CPUs: the first width computes (8 threads on a CPU or its run queue the
    whole time), so it goes to one thread to climb from there."""
    w = _first(Width("auto", cpus=cpus, gil=False), 2.0, 6.0)
    assert (w.now, w.settled) == (1, False)
    return w


def _at(w: Width, rate: float, cpus_busy: float = 1.0):
    """The width now measured (fresh batch, then a judged one) at `rate` samples/s, on a CPU
    `cpus_busy` of the wall time."""
    w.observe(1000, 1.0, 0.01)  # (fresh)
    wall = 1000 / rate
    w.observe(1000, wall, cpus_busy * wall)


def test_without_the_gil_a_worker_that_computes_doubles_up_to_its_cpus():
    w = _climbing(cpus=4)
    _at(w, 100.0)  # one thread
    assert (w.now, w.settled) == (2, False)
    _at(w, 190.0, 2.0)  # two threads, two CPUs busy
    assert (w.now, w.settled) == (4, False)
    _at(w, 370.0, 4.0)
    assert (w.now, w.settled) == (4, True)  # its share of the CPUs: no wider


def test_without_the_gil_it_stops_when_the_samples_per_second_stop_rising():
    w = _climbing(cpus=8)
    _at(w, 100.0)
    _at(w, 190.0, 2.0)
    assert w.now == 4
    _at(w, 200.0, 4.0)  # 4 threads on a machine whose CPUs are taken: no gain
    assert (w.now, w.settled) == (2, True)  # back to the width before, and it stays
    w.observe(1000, 0.1, 0.1)
    assert w.now == 2


def test_without_the_gil_a_share_of_one_cpu_is_one_thread():
    w = _first(Width("auto", cpus=1, gil=False), 2.0, 6.0)
    assert (w.now, w.settled) == (1, True)


def test_without_the_gil_the_climb_stops_at_the_batch():
    w = Width("auto", cpus=64, gil=False)
    w.observe(3, 1.0, 0.01)  # (fresh)
    for _ in range(6):  # 18 samples: 2 rounds of 8 threads
        w.observe(3, 1.0, 2.0)
    assert (w.now, w.settled) == (1, False)
    w.observe(3, 1.0, 0.01)  # (fresh)
    w.observe(3, 1.0, 1.0)  # one thread: a batch of 3 is 2 rounds
    assert w.now == 2
    w.observe(3, 1.0, 0.01)  # (fresh)
    w.observe(3, 0.5, 1.0)
    w.observe(3, 0.5, 1.0)  # (6 samples: 2 rounds of 2) twice the samples per second
    assert (w.now, w.settled) == (3, False)  # the batch's size, below 4 and its 64 CPUs
    w.observe(3, 1.0, 0.01)  # (fresh)
    w.observe(3, 0.4, 1.2)
    w.observe(3, 0.4, 1.2)
    assert (w.now, w.settled) == (3, True)  # it gained, and can go no wider


def test_without_the_gil_a_worker_that_waits_jumps_as_with_it():
    w = _first(Width("auto", cpus=2, gil=False), 0.1)
    assert (w.now, w.settled) == (64, False)  # the share of CPUs bounds computing threads only


def test_a_climb_that_waits_at_one_thread_jumps_by_the_share_it_waited():
    w = _climbing(cpus=2)
    _at(w, 100.0, 0.25)  # one thread waits 75% of the time: 0.8 / 0.25 = 3 times
    assert (w.now, w.settled) == (3, False)


# -- InFlight ----------------------------------------------------------------------------------
class Plain:
    def __getitem__(self, i):
        return i


def test_inflight_gives_its_width_the_workers_cpus():
    fl = InFlight(Plain(), LoadSettings(threads="auto", cpus=6))
    assert fl.width.cpus == 6 and fl.width.now == 8
    fl.close()
    assert Width("auto").cpus == 1 and Width(3, cpus=0).cpus == 1


class _Clock:
    def __init__(self, *times):
        self.times = list(times)
        self.asked = []

    def __call__(self, runqueue=False):
        self.asked.append(runqueue)
        return self.times.pop(0)


def test_a_batch_is_judged_with_the_run_queue_while_auto_judges(monkeypatch):
    fl = InFlight(Plain(), LoadSettings(threads="auto"))
    seen = []
    fl.width.observe = lambda n, wall, cpu, rq: seen.append((n, wall, cpu, rq))
    clock = _Clock((1.0, 0.5, 2.0), (11.0, 2.5, 5.5), (12.0, 3.0, 6.0), (13.0, 3.5, 5.0))
    monkeypatch.setattr(inflight, "_now", clock)
    fl.map(lambda i: i, [1, 2, 3])
    assert seen == [(3, 10.0, 2.0, 3.5)] and clock.asked == [True, True]
    fl.map(lambda i: i, [1, 2, 3])  # (a thread ended: its run queue left the sum)
    assert seen[-1] == (3, 1.0, 0.5, 0.0)
    fl.width.settled = True  # settled: the run queue is no longer read
    fl.close()
    fl = InFlight(Plain(), LoadSettings(threads=3))
    clock = _Clock((1.0, 0.5, 0.0), (2.0, 0.6, 0.0))
    monkeypatch.setattr(inflight, "_now", clock)
    fl.map(lambda i: i, [1, 2, 3])
    assert clock.asked == [False, False]  # a fixed width never reads it
    fl.close()


def test_now_reads_the_run_queue_when_asked(monkeypatch):
    monkeypatch.setattr(inflight._system, "runqueue_seconds", lambda: 1.25)
    assert inflight._now(True)[2] == 1.25
    assert inflight._now(False)[2] == 0.0
    monkeypatch.setattr(inflight._system, "runqueue_seconds", lambda: None)
    assert inflight._now(True)[2] == 0.0  # the kernel does not say: CPU time alone
