"""stoker.worker.inflight: how many samples load at once ("auto"'s Width, decided from made-up
batch timings: no clock), what a setting means for a dataset, and InFlight's paths (one at a
time, threads, a batch started ahead, an event loop). No process."""

from __future__ import annotations

import asyncio
import threading

import pytest

from stoker.config.load import LoadSettings, is_async, threads_for
from stoker.worker import inflight
from stoker.worker.inflight import InFlight, Width, resolve


def at(threads, dataset=None) -> LoadSettings:
    """Settings loading `threads` at once (None: resolved for `dataset`, as the iterator does)."""
    return LoadSettings(threads=threads_for(threads, dataset))

pytestmark = pytest.mark.unit  # no process (tests/support/tiers.py)


def test_the_constants():
    assert (inflight.WAITING_SHARE, inflight.GAIN, inflight.START, inflight.JUMP,
            inflight.JUDGED_ROUNDS, inflight.MAX_THREADS) == (0.6, 1.1, 8, 0.8, 2, 256)


def test_a_fixed_width_never_changes():
    for setting, now in ((4, 4), ("3", 3), (1, 1)):
        w = Width(setting)
        assert (w.now, w.auto, w.settled) == (now, False, True)
        for _ in range(5):
            w.observe(64, 1.0, 0.01)
        assert w.now == now


def test_auto_starts_at_eight_unsettled():
    w = Width("auto")
    assert (w.now, w.auto, w.settled) == (8, True, False)


def _auto(size=1000):
    """An "auto" width whose first (fresh) batch of `size` samples was seen."""
    w = Width("auto")
    w.observe(size, 1.0, 0.01)
    assert w.now == 8 and not w.settled
    return w


def test_the_first_batch_at_a_width_is_not_judged():
    w = Width("auto")
    w.observe(1000, 1.0, 0.01)
    assert (w.now, w.settled) == (8, False)
    w.observe(1000, 1.0, 0.1)  # judged: waits 90% of the time
    assert w.now == 64


def test_a_waiting_worker_jumps_by_the_share_it_waited():
    w = _auto()
    w.observe(1000, 1.0, 0.1)  # on a CPU 10%: 0.8 * 10 = 8 times wider
    assert (w.now, w.settled) == (64, False)
    w = _auto()
    w.observe(1000, 1.0, 0.25)  # 0.8 * 4 = 3.2: 3 times
    assert w.now == 24
    w = _auto()
    w.observe(1000, 1.0, 0.5)  # 0.8 * 2 = 1.6: at least twice
    assert w.now == 16
    w = _auto()
    w.observe(1000, 1.0, 0.0)  # no CPU at all: as wide as it goes
    assert w.now == 256


def test_a_jump_stops_at_the_batch_and_at_the_most_threads():
    w = _auto(size=40)
    w.observe(40, 1.0, 0.01)
    assert (w.now, w.settled) == (40, False)
    w = _auto(size=5000)
    w.observe(5000, 1.0, 0.001)
    assert w.now == 256


def test_a_worker_on_its_cpu_from_the_start_goes_to_one_thread():
    w = _auto()
    w.observe(1000, 1.0, 0.6)  # exactly the waiting share: computing
    assert (w.now, w.settled) == (1, True)
    w.observe(1000, 1.0, 0.01)
    assert w.now == 1
    w = _auto()
    w.observe(1000, 1.0, 0.59)  # just below: waiting, at least a doubling
    assert (w.now, w.settled) == (16, False)


def test_a_width_is_judged_over_two_rounds_of_its_threads():
    w = Width("auto")
    w.observe(10, 1.0, 0.01)  # (fresh)
    w.observe(10, 1.0, 0.1)  # 10 samples < 2 * 8: not yet
    assert w.now == 8
    w.observe(10, 1.0, 0.1)  # 20 samples over 2 s, 0.2 s on a CPU: 8 times
    assert w.now == 10  # (the batch's size)
    w = Width("auto")
    w.observe(16, 1.0, 0.01)
    w.observe(16, 1.0, 0.1)  # exactly 2 rounds: judged
    assert w.now == 16


def test_what_the_window_adds_up():
    w = Width("auto")
    w.observe(10, 1.0, 0.01)
    w.observe(10, 1.0, 0.35)
    w.observe(10, 3.0, 0.05)  # 20 samples, 4 s, 0.4 s CPU: 0.8 * 10 = 8 times (capped at 10)
    assert w.now == 10
    w = Width("auto")
    w.observe(10, 1.0, 0.01)
    w.observe(10, 1.0, 0.3)
    w.observe(10, 1.0, 0.5)  # 2 s, 0.8 s on a CPU (40%): waiting, 0.8 * 2 / 0.8 = 2 times
    assert w.now == 10 and not w.settled
    w = Width("auto")
    w.observe(10, 1.0, 0.01)
    w.observe(10, 1.0, 0.7)
    w.observe(10, 1.0, 0.5)  # 1.2 of 2 s: computing
    assert (w.now, w.settled) == (1, True)


def test_short_batches_and_nonsense_are_not_judged():
    w = _auto(size=100)
    w.observe(99, 1.0, 0.01)  # a short (last) batch
    w.observe(1, 1.0, 0.01)
    w.observe(100, 0.0, 0.0)
    w.observe(100, -1.0, 0.0)
    assert (w.now, w.settled) == (8, False)
    w.observe(100, 1.0, 0.01)
    assert w.now == 100


def test_a_larger_batch_raises_the_size_that_judges():
    w = Width("auto")
    w.observe(20, 1.0, 0.01)  # (fresh)
    w.observe(30, 1.0, 0.01)  # judged: its size is the largest
    assert w.now == 30
    w2 = Width("auto")
    w2.observe(2, 1.0, 0.5)  # two samples count
    w2.observe(2, 1.0, 0.5)
    assert w2.now == 8 and not w2._fresh


def _jump(rate_after, cpu_share):
    """Width 8 measured at 100 samples/s waiting (CPU 10%) jumps to 64; then 64 is measured at
    `rate_after` samples/s with `cpu_share` of the time on a CPU."""
    w = Width("auto")
    w.observe(1000, 10.0, 0.01)  # (fresh)
    w.observe(1000, 10.0, 1.0)
    assert w.now == 64
    w.observe(1000, 1.0, 0.01)  # (fresh at 64)
    wall = 1000 / rate_after
    w.observe(1000, wall, cpu_share * wall)
    return w


def test_a_jump_that_lost_is_undone():
    w = _jump(74.9, 0.0)
    assert (w.now, w.settled) == (8, True)


def test_a_jump_that_did_not_gain_is_undone_though_the_worker_still_waits():
    # threads that wait for what serves no more at once (the GIL held by a thread that waits,
    # a full link): the samples per second do not rise, and the width goes back
    w = _jump(109.999, 0.0)
    assert (w.now, w.settled) == (8, True)
    w = _jump(110.001, 0.0)  # gained GAIN: it goes on, by the share it waited
    assert (w.now, w.settled) == (256, False)


def test_a_jump_that_made_the_cpu_busy_is_undone_unless_it_gained():
    w = _jump(109.999, 0.6)
    assert (w.now, w.settled) == (8, True)
    w = _jump(110.001, 0.6)  # gained GAIN: one doubling more
    assert (w.now, w.settled) == (128, False)


def test_after_a_doubling_that_lost_the_best_width_is_kept():
    w = _jump(200.0, 0.6)
    assert w.now == 128
    w.observe(1000, 1.0, 0.01)  # (fresh)
    w.observe(1000, 10.0, 6.0)  # 100/s: below 0.75 of 200
    assert (w.now, w.settled) == (64, True)  # 64 had the best rate


def test_a_width_at_its_largest_settles():
    w = _auto(size=8)
    w.observe(16, 1.0, 0.01)  # (a larger batch: the size is 16 now)
    assert w.now == 16
    w.observe(16, 1.0, 0.01)  # (fresh)
    w.observe(16, 0.5, 0.01)
    assert (w.now, w.settled) == (16, False)  # 16 samples: not two rounds of 16
    w.observe(16, 0.5, 0.01)  # judged (it gained): it can go no wider than the batch
    assert (w.now, w.settled) == (16, True)


# -- settings -------------------------------------------------------------------------------------------
class Plain:
    def __getitem__(self, i):
        return i


class AsyncItem:
    async def __getitem__(self, i):
        return i


class AsyncItems:
    def __getitem__(self, i):
        return i

    async def __getitems__(self, ix):
        return list(ix)


def test_async_datasets():
    assert not is_async(Plain()) and is_async(AsyncItem()) and is_async(AsyncItems())
    assert not is_async(object())
    assert threads_for(None, AsyncItems()) == "auto" and threads_for(None, Plain()) == 1
    assert threads_for(3, AsyncItem()) == 3 and threads_for("auto", Plain()) == "auto"


def test_concurrent():
    assert not InFlight(Plain(), at(1)).concurrent
    assert InFlight(Plain(), at(2)).concurrent
    assert InFlight(Plain(), at("auto")).concurrent
    assert InFlight(AsyncItem(), at(1)).concurrent
    w = Width(5)
    assert InFlight(Plain(), at(1), width=w).width is w


# -- loading --------------------------------------------------------------------------------------------
def _load(item):
    if item == "bad":
        raise KeyError(item)
    return item * 2


def test_one_at_a_time_on_this_thread():
    fl = InFlight(Plain(), at(1))
    threads, shown = [], []

    def load(i):
        threads.append(threading.get_ident())
        return _load(i)

    out = fl.map(load, [1, "bad", 3], progress=shown.append)
    assert out[0] == (True, 2, None) and out[2] == (True, 6, None)
    assert out[1][0] is False and out[1][1] is None and isinstance(out[1][2], KeyError)
    assert set(threads) == {threading.get_ident()}
    assert shown == [1, 1, 1, 0]  # before the first, then as each is done
    assert fl.peak == 0 and fl._gate is None
    fl.close()


def test_threads_load_in_order_and_report_progress():
    fl = InFlight(Plain(), at(3))
    shown = []
    out = fl.map(_load, list(range(7)), progress=shown.append)
    assert out == [(True, i * 2, None) for i in range(7)]
    assert shown[0] == 3 and len(shown) == 8 and shown[-1] == 0
    assert shown == [3, 3, 3, 3, 3, 2, 1, 0]
    assert 1 <= fl.peak <= 3 and fl._gate.width == 3
    out = fl.map(_load, [1, 2])
    assert out == [(True, 2, None), (True, 4, None)]
    fl.close()
    assert fl._gate is None and fl.peak == 0


def test_a_serial_batch_loads_one_at_a_time_whatever_the_width():
    fl = InFlight(Plain(), at("auto"))
    threads = []

    def load(i):
        threads.append(threading.get_ident())
        return i

    shown = []
    assert [v for _, v, _ in fl.map(load, [1, 2, 3], serial=True, progress=shown.append)] == [
        1, 2, 3]
    assert set(threads) == {threading.get_ident()} and shown == [1, 1, 1, 0]
    assert fl.width.now == 8 and fl.width._fresh  # (a serial batch is not judged)
    fl.close()


def test_a_batch_of_one_loads_on_this_thread():
    fl = InFlight(Plain(), at(4))
    seen = []
    fl.map(lambda i: seen.append(threading.get_ident()) or i, [5])
    assert seen == [threading.get_ident()] and fl._gate is None
    fl.close()


def test_the_width_is_observed_and_the_gate_resized():
    fl = InFlight(Plain(), at("auto"))
    seen = []
    fl.width.observe = lambda n, wall, cpu, rq: seen.append((n, wall >= 0, cpu >= 0, rq >= 0))
    fl.map(_load, list(range(10)))
    assert seen == [(10, True, True, True)]
    fl.width.now = 3
    fl.map(_load, list(range(4)))
    assert fl._gate.width == 3
    fl.close()


def test_a_batch_started_ahead_is_taken_up():
    fl = InFlight(Plain(), at(2))
    fl.map(_load, [0, 1])  # (a gate)
    calls = []

    def load(i):
        calls.append(i)
        return i

    fl.start_ahead("next", load, [7, 8, 9])
    assert "next" in fl._ahead and "next" in fl._ahead_at
    shown = []
    out = fl.map(load, [7, 8, 9], key="next", progress=shown.append)
    assert out == [(True, 7, None), (True, 8, None), (True, 9, None)]
    assert sorted(calls) == [7, 8, 9]  # each loaded once
    assert fl._ahead == {} and fl._ahead_at == {} and shown[0] == 2 and len(shown) == 4
    out = fl.map(load, [1, 2], key="other")  # nothing started for it: loaded now
    assert out == [(True, 1, None), (True, 2, None)]
    fl.close()


def test_a_batch_yields_once_as_each_item_is_done():
    fl = InFlight(Plain(), at(4))
    batch = fl.start(_load, list(range(8)))
    assert len(list(batch)) == 8 and list(batch) == []  # (once: done is done)
    assert batch.outcomes() == [(True, i * 2, None) for i in range(8)]
    assert batch.outcomes() is batch.outcomes()  # (the outcomes, once)
    fl.close()


def test_a_batch_yields_the_places_it_leaves_free():
    """The width less its items still loading: above 0 once fewer than the width are left
    (when the worker loop may start the next task's samples)."""
    fl = InFlight(Plain(), at(4))
    done = [0]

    def progress(_):
        done[0] += 1

    batch = fl.start(_load, list(range(8)), progress=progress)
    free = []
    for f in batch:
        free.append((f, done[0] - 1))
    assert free == [(-3, 1), (-2, 2), (-1, 3), (0, 4), (1, 5), (2, 6), (3, 7), (4, 8)]
    fl.close()


def test_one_at_a_time_or_async_a_batch_yields_nothing_and_loads_in_outcomes():
    fl = InFlight(Plain(), at(4))
    calls = []
    batch = fl.start(lambda i: calls.append(i) or i, [1, 2, 3], serial=True)
    assert calls == [] and list(batch) == [] and calls == []
    assert [v for _, v, _ in batch.outcomes()] == [1, 2, 3] and calls == [1, 2, 3]
    fl.close()
    fl = InFlight(AsyncItem(), at(3))
    batch = fl.start(lambda i: i, [1, 2])
    assert list(batch) == [] and [v for _, v, _ in batch.outcomes()] == [1, 2]
    fl.close()


def test_drop_ahead_forgets_the_batches_started_ahead():
    fl = InFlight(Plain(), at(1))
    hold = threading.Event()
    started = threading.Event()

    def slow(i):
        started.set()
        assert hold.wait(10)
        return i

    fl.start_ahead("a", slow, [1, 2, 3])
    assert started.wait(10)
    threading.Timer(0.05, hold.set).start()
    fl.drop_ahead()  # waits for the one running; the others never start
    assert fl._ahead == {} and fl._ahead_at == {}
    fl.close()


def test_close_cancels_what_was_started_ahead():
    fl = InFlight(Plain(), at(1))
    hold = threading.Event()

    def slow(i):
        assert hold.wait(10)
        return i

    fl.start_ahead("a", slow, [1, 2])
    futures = fl._ahead["a"]
    fl.close()
    hold.set()
    assert futures[1].cancelled()
    assert fl._ahead == {} and fl._ahead_at == {} and fl._gate is None


def test_a_forked_copys_gate_is_made_again():
    fl = InFlight(Plain(), at(2))
    fl.map(_load, [1, 2])
    old = fl._gate
    old._pid = -1  # (as a copy made by fork sees it)
    assert fl.peak == 0
    assert fl._the_gate() is not old and fl._gate.usable()
    fl.close()


# -- async ------------------------------------------------------------------------------------------------
def test_an_async_batch_on_one_loop_bounded_by_the_width():
    fl = InFlight(AsyncItem(), at(3))
    now = most = 0

    async def one(i):
        nonlocal now, most
        now += 1
        most = max(most, now)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        now -= 1
        if i == 4:
            raise ValueError("four")
        return i

    shown = []
    out = fl.map(one, list(range(9)), progress=shown.append)
    assert [v for ok, v, _ in out if ok] == [0, 1, 2, 3, 5, 6, 7, 8]
    assert out[4][0] is False and isinstance(out[4][2], ValueError) and out[4][1] is None
    assert most == 3 and len(shown) == 10 and shown[0] == 3 and shown[-1] == 0
    loop = fl._loop
    fl.map(lambda i: i, [1])  # a plain value from an async dataset's load: as it is
    assert fl._loop is loop
    fl.close()
    assert fl._loop is None and loop.is_closed()


def test_an_async_serial_batch_is_one_at_a_time():
    fl = InFlight(AsyncItem(), at(8))
    now = most = 0

    async def one(i):
        nonlocal now, most
        now += 1
        most = max(most, now)
        await asyncio.sleep(0)
        now -= 1
        return i

    assert [v for _, v, _ in fl.map(one, list(range(5)), serial=True)] == list(range(5))
    assert most == 1
    fl.close()


def test_resolve():
    assert resolve(5) == 5

    async def v():
        return 7

    assert resolve(v()) == 7
    fl = InFlight(AsyncItem(), at(2))
    assert resolve(v(), fl) == 7

    async def bad():
        raise LookupError("x")

    with pytest.raises(LookupError):
        resolve(bad(), fl)
    fl.close()


def test_now_is_the_clock_and_the_cpu():
    (wall, cpu, rq) = inflight._now()
    assert wall > 0 and cpu >= 0 and rq == 0.0  # (the run queue only when asked)
    assert inflight._call(_load, 2) == (True, 4, None)
    ok, value, e = inflight._call_with((_load, "bad"))
    assert (ok, value) == (False, None) and isinstance(e, KeyError)


def test_resolve_on_a_loop_owner_returns_falsy_values_and_raises_the_error():
    fl = InFlight(AsyncItem(), at(2))

    async def zero():
        return 0

    async def bad():
        raise ValueError("v")

    assert resolve(zero(), fl) == 0
    with pytest.raises(ValueError, match="^v$"):
        resolve(bad(), fl)
    fl.close()


class _Clock:
    """inflight._now, made up: each call returns the next (wall, cpu[, run queue]); what it was
    asked (whether to read the run queue) is kept in ``asked``."""

    def __init__(self, *times):
        self.times = list(times)
        self.asked = []

    def __call__(self, runqueue=False):
        self.asked.append(runqueue)
        t = self.times.pop(0)
        return t if len(t) == 3 else (*t, 0.0)


def _observed(fl, with_runqueue=False):
    seen = []
    fl.width.observe = lambda n, wall, cpu, rq: seen.append(
        (n, wall, cpu, rq) if with_runqueue else (n, wall, cpu))
    return seen


def test_a_batch_is_timed_from_its_start(monkeypatch):
    fl = InFlight(Plain(), at("auto"))
    seen = _observed(fl)
    monkeypatch.setattr(inflight, "_now", _Clock((1.0, 0.5), (11.0, 2.5)))
    fl.map(_load, [1, 2, 3])
    assert seen == [(3, 10.0, 2.0)]
    fl.close()


def test_a_batch_started_ahead_is_timed_from_when_the_one_before_was_done(monkeypatch):
    fl = InFlight(Plain(), at("auto"))
    seen = _observed(fl)
    monkeypatch.setattr(inflight, "_now", _Clock(
        (0.0, 0.0), (10.0, 1.0),  # the batch before: done at 10 s
        (5.0, 0.5),  # the next started ahead at 5 s (while it loaded)
        (20.0, 2.0), (30.0, 3.0)))  # the next taken up at 20 s, done at 30 s
    fl.map(_load, [1, 2])
    fl.start_ahead("b", _load, [3, 4])
    fl.map(_load, [3, 4], key="b")
    assert seen == [(2, 10.0, 1.0), (2, 20.0, 2.0)]  # from 10 s: the delivery after the last
    fl.close()


def test_a_batch_started_ahead_later_is_timed_from_its_start(monkeypatch):
    fl = InFlight(Plain(), at("auto"))
    seen = _observed(fl)
    monkeypatch.setattr(inflight, "_now", _Clock(
        (0.0, 0.0), (10.0, 1.0), (12.0, 1.5), (20.0, 2.0), (30.0, 3.0)))
    fl.map(_load, [1, 2])
    fl.start_ahead("b", _load, [3, 4])
    fl.map(_load, [3, 4], key="b")
    assert seen == [(2, 10.0, 1.0), (2, 18.0, 1.5)]
    fl.close()


def test_the_first_batch_started_ahead_is_timed_from_its_start(monkeypatch):
    fl = InFlight(Plain(), at(2))
    seen = _observed(fl)
    monkeypatch.setattr(inflight, "_now", _Clock((5.0, 0.5), (3.0, 0.1), (9.0, 1.0)))
    fl.start_ahead("a", _load, [1, 2])
    fl.map(_load, [1, 2], key="a")  # nothing was done before it: from when it started
    assert seen == [(2, 4.0, 0.5)]
    fl.close()


def test_a_batch_started_ahead_yields_as_its_items_are_done_too():
    fl = InFlight(Plain(), at(4))
    fl.start_ahead("a", _load, [1, 2, 3])
    batch = fl.start(_load, [1, 2, 3], key="a")
    assert list(batch) == [2, 3, 4]
    assert batch.outcomes() == [(True, 2, None), (True, 4, None), (True, 6, None)]
    fl.close()


def test_the_window_counts_samples_from_zero_after_a_fresh_batch():
    w = Width("auto")
    w.observe(5, 1.0, 0.01)  # (fresh)
    for _ in range(3):
        w.observe(5, 1.0, 0.1)  # 5, 10, 15 samples: below 2 rounds of 8
    assert (w.now, w.settled) == (8, False)
    w.observe(5, 1.0, 0.1)  # 20: judged (no wider than the batch: it stays)
    assert (w.now, w.settled) == (8, True)
