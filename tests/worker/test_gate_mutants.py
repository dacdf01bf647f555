"""stoker.worker.gate: at most `width` loads at once on the gate's own threads. Concurrency is
shown with events and barriers (each wait bounded), never with timing."""

from __future__ import annotations

import threading
import time

import pytest

from stoker.worker.gate import Gate

pytestmark = pytest.mark.unit  # no process (tests/support/tiers.py)

WAIT_S = 10


def _settled(gate):
    """Waits (bounded) until no load runs: a future is done just before its place is freed."""
    deadline = time.monotonic() + WAIT_S
    while gate.running and time.monotonic() < deadline:
        time.sleep(0.001)
    return gate.running


def test_a_new_gate():
    g = Gate(3)
    assert (g.width, g.running, g.threads, g.peak) == (3, 0, 0, 0)
    assert g.usable()
    g.close()


def test_a_width_below_one_is_refused():
    with pytest.raises(ValueError) as info:
        Gate(0)
    assert str(info.value) == "a gate's width is at least 1, got 0"
    g = Gate(1)
    with pytest.raises(ValueError) as info:
        g.resize(-2)
    assert str(info.value) == "a gate's width is at least 1, got -2"
    assert g.width == 1
    g.close()


def test_its_threads_are_named_and_joined_at_exit():
    g = Gate(2)
    barrier = threading.Barrier(2)

    def who(_):
        barrier.wait(WAIT_S)
        t = threading.current_thread()
        return t.name, t.daemon

    got = sorted(f.result(WAIT_S) for f in [g.submit(who, i) for i in range(2)])
    # not daemons: the interpreter closes the gate and joins them as it exits (gate._close_all)
    assert got == [("stoker-sample_0", False), ("stoker-sample_1", False)]
    g.close()
    g2 = Gate(1, name="mine")
    assert g2.submit(lambda _: threading.current_thread().name, 0).result(WAIT_S) == "mine_0"
    g2.close()


def test_threads_start_as_loads_need_them():
    g = Gate(4)
    assert g.submit(lambda x: x, 1).result(WAIT_S) == 1
    assert g.threads == 1
    hold = threading.Event()
    started = threading.Semaphore(0)

    def held(x):
        started.release()
        assert hold.wait(WAIT_S)
        return x

    fs = [g.submit(held, i) for i in range(6)]
    for _ in range(4):
        assert started.acquire(timeout=WAIT_S)
    assert g.threads == 4 and g.running == 4  # never more than the width
    hold.set()
    assert [f.result(WAIT_S) for f in fs] == list(range(6))
    assert _settled(g) == 0 and g.peak == 4
    g.close()


def test_results_and_raises_are_the_futures():
    g = Gate(2)
    assert g.submit(lambda x: x * 3, 5).result(WAIT_S) == 15

    def bad(x):
        raise KeyError(x)

    with pytest.raises(KeyError):
        g.submit(bad, "k").result(WAIT_S)
    assert g.submit(lambda x: None, 0).result(WAIT_S) is None
    assert _settled(g) == 0
    g.close()


def test_peak_counts_the_most_at_once():
    g = Gate(3)
    for i in range(5):  # one at a time
        assert g.submit(lambda x: x, i).result(WAIT_S) == i
    assert g.peak == 1 and _settled(g) == 0
    barrier = threading.Barrier(2)
    fs = [g.submit(lambda _: barrier.wait(WAIT_S), i) for i in range(2)]
    [f.result(WAIT_S) for f in fs]
    assert g.peak == 2 and _settled(g) == 0
    g.close()


def test_report_running_follows_every_change():
    """What the worker's status page shows as "at once": each change of the number running,
    a place taken by the caller's own thread included; None stops the reports."""
    g = Gate(2)
    seen: list = []
    g.report_running(seen.append)
    assert seen == [0]  # (what runs when it is asked: nothing yet)
    barrier = threading.Barrier(3)
    fs = [g.submit(lambda _: barrier.wait(WAIT_S), i) for i in range(2)]
    barrier.wait(WAIT_S)  # both run now
    [f.result(WAIT_S) for f in fs]
    assert _settled(g) == 0
    assert seen[:3] == [0, 1, 2] and seen[-1] == 0 and max(seen) == 2 and len(seen) == 5
    with g.place():
        assert seen[-1] == 1
    assert seen[-1] == 0 and len(seen) == 7
    g.report_running(None)
    g.submit(lambda x: x, 1).result(WAIT_S)
    assert _settled(g) == 0 and len(seen) == 7
    g.close()


def test_widening_starts_what_waits_at_once():
    g = Gate(1)
    barrier = threading.Barrier(3)
    fs = [g.submit(lambda _: barrier.wait(WAIT_S), i) for i in range(3)]
    g.resize(3)  # the first waits at the barrier: the other two must start now
    assert sorted(f.result(WAIT_S) for f in fs) == [0, 1, 2]
    assert g.threads == 3 and g.width == 3
    g.close()


def test_resizing_to_the_same_width_changes_nothing():
    g = Gate(2)
    g.resize(2)
    assert g.width == 2 and g.threads == 0
    assert g.submit(lambda x: x, 4).result(WAIT_S) == 4
    g.close()


def test_a_narrowed_gate_frees_places_one_by_one():
    g = Gate(2)
    hold = threading.Event()
    started = threading.Semaphore(0)
    now = [0]
    most = [0]
    lock = threading.Lock()

    def load(x):
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        started.release()
        hold.wait(WAIT_S)
        with lock:
            now[0] -= 1
        return x

    fs = [g.submit(load, i) for i in range(2)]
    for _ in range(2):
        assert started.acquire(timeout=WAIT_S)
    g.resize(1)
    more = [g.submit(load, i) for i in range(2, 6)]
    hold.set()
    assert [f.result(WAIT_S) for f in fs + more] == list(range(6))
    assert most[0] == 2 and _settled(g) == 0
    g.close()


def test_a_narrowed_gate_parks_its_threads_past_the_width():
    """Only the threads within the width take loads (each load done wakes the next waiting
    thread in turn: left among them, 4 threads behind a width of 1 took the loads in turn, each
    runnable meanwhile); those past it are parked, not ended (their CPU stays in what the kernel
    says of the live threads), and serve again once widened."""
    g = Gate(4, name="narrow-check")
    barrier = threading.Barrier(4)
    [f.result(WAIT_S) for f in [g.submit(lambda _: barrier.wait(WAIT_S), i) for i in range(4)]]
    assert g.threads == 4
    g.resize(1)
    names = {g.submit(lambda _: threading.current_thread().name, i).result(WAIT_S)
             for i in range(12)}
    assert names == {"narrow-check_0"}, names
    alive = [t for t in threading.enumerate() if t.name.startswith("narrow-check_")]
    assert len(alive) == 4 and g.threads == 4  # (parked, alive)
    g.resize(3)
    barrier = threading.Barrier(3)
    [f.result(WAIT_S) for f in [g.submit(lambda _: barrier.wait(WAIT_S), i) for i in range(3)]]
    assert g.peak == 4 and _settled(g) == 0
    g.close()
    for t in alive:
        t.join(WAIT_S)
    assert not any(t.is_alive() for t in alive)


def test_a_report_that_raises_is_dropped():
    g = Gate(2)
    calls = []

    def bad(n):
        calls.append(n)
        raise RuntimeError("a status page gone")

    g.report_running(bad)
    assert [g.submit(lambda x: x, i).result(WAIT_S) for i in range(3)] == [0, 1, 2]
    assert _settled(g) == 0 and calls
    g.close()


def test_cancel_waiting_cancels_what_has_not_started():
    g = Gate(1)
    hold = threading.Event()
    started = threading.Event()

    def held(x):
        started.set()
        assert hold.wait(WAIT_S)
        return x

    running = g.submit(held, 0)
    assert started.wait(WAIT_S)
    waiting = [g.submit(held, i) for i in (1, 2)]
    g.cancel_waiting()
    assert all(f.cancelled() for f in waiting)
    hold.set()
    assert running.result(WAIT_S) == 0
    assert g.usable() and g.submit(lambda x: x, 9).result(WAIT_S) == 9  # it goes on
    g.close()


def test_a_closed_gate_is_not_usable_and_refuses_loads():
    g = Gate(1)
    g.close()
    assert not g.usable()
    with pytest.raises(RuntimeError) as info:
        g.submit(lambda x: x, 1)
    assert str(info.value) == "stoker: the gate is closed"


def test_a_copy_made_by_fork_is_not_usable():
    g = Gate(1)
    g._pid = -1  # (what a forked copy sees: another process made it)
    assert not g.usable()
    g.close()


def test_close_ends_the_threads():
    g = Gate(2, name="close-check")
    [f.result(WAIT_S) for f in [g.submit(lambda x: x, i) for i in range(4)]]
    threads = [t for t in threading.enumerate() if t.name.startswith("close-check_")]
    assert len(threads) == g.threads
    g.close()
    for t in threads:
        t.join(WAIT_S)
        assert not t.is_alive()
