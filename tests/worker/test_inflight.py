"""The samples a worker loads at once (worker/gate.py, worker/inflight.py, worker/fetch.py's
policies over them): each sample loaded once, never more than the width at once, a batch started
ahead taken up whatever the width became. A fake load and no process: what a worker's main thread
does, run on the test's thread. No timing: concurrency is shown with barriers and counters."""

from __future__ import annotations

import asyncio
import collections
import threading

import pytest

from stoker.config.load import LoadSettings, threads_for
from stoker.worker.fetch import AllSkipped, MapFetcher
from stoker.worker.gate import Gate
from stoker.worker.inflight import InFlight

pytestmark = pytest.mark.unit  # no process (tests/support/tiers.py)

WAIT_S = 10  # a barrier or an event that waits this long has failed (no test waits for it)


def at(threads, dataset=None) -> LoadSettings:
    """Settings loading `threads` at once (None: resolved for `dataset`, as the iterator does)."""
    return LoadSettings(threads=threads_for(threads, dataset))


class Counting:
    """A load that counts its calls per item and the most running at once. `barrier`: each
    call waits at it first (so `parties` must run at once, or the test fails), `hold`: each
    call (of `held`, if given) waits for this event; `fail`: item -> how many of its first calls raise."""

    def __init__(self, barrier: threading.Barrier | None = None,
                 hold: threading.Event | None = None, fail: dict | None = None, held=None):
        self.calls: collections.Counter = collections.Counter()
        self.lock = threading.Lock()
        self.now = self.most = 0
        self.at_start: dict = {}  # item -> how many ran (itself included) as it started
        self.barrier = barrier
        self.hold = hold
        self.held = held  # the items that wait for `hold` (None: every one)
        self.fail = dict(fail or {})  # item -> how many of its first calls raise
        self.started = threading.Semaphore(0)  # released as each call starts

    def __call__(self, item):
        with self.lock:
            self.calls[item] += 1
            self.now += 1
            self.most = max(self.most, self.now)
            self.at_start[item] = self.now
            failing = self.fail.get(item, 0) > 0
            if failing:
                self.fail[item] -= 1
        self.started.release()
        try:
            if self.barrier is not None:
                self.barrier.wait(WAIT_S)
            if self.hold is not None and (self.held is None or item in self.held):
                assert self.hold.wait(WAIT_S), "held too long"
            if failing:
                raise ValueError(f"item {item} failed")
            return item * 10
        finally:
            with self.lock:
                self.now -= 1


class Plain:
    def __getitem__(self, i):
        return i


class Async:
    async def __getitem__(self, i):
        return i


def values(out):
    return [v for _, v, _ in out]


# -- the gate --------------------------------------------------------------------------------------
def test_gate_runs_at_most_its_width_in_order():
    gate = Gate(3)
    load = Counting(barrier=threading.Barrier(3))
    futures = [gate.submit(load, i) for i in range(12)]
    assert [f.result(WAIT_S) for f in futures] == [i * 10 for i in range(12)]
    assert load.most == 3 and gate.peak == 3 and gate.threads == 3
    assert all(n == 1 for n in load.calls.values())
    gate.close()


def test_gate_narrowed_starts_nothing_new_until_below_the_new_width():
    gate = Gate(4)
    hold = threading.Event()
    load = Counting(hold=hold)
    first = [gate.submit(load, i) for i in range(4)]
    for _ in range(4):
        assert load.started.acquire(timeout=WAIT_S)
    gate.resize(1)
    later = [gate.submit(load, i) for i in range(4, 8)]
    hold.set()  # the four running finish; then one at a time
    assert [f.result(WAIT_S) for f in first + later] == [i * 10 for i in range(8)]
    assert load.most == 4  # (those running when it narrowed)
    gate2 = Gate(4)
    load2 = Counting()
    gate2.resize(1)
    assert [f.result(WAIT_S) for f in [gate2.submit(load2, i) for i in range(6)]]
    assert load2.most == 1
    gate.close()
    gate2.close()


def test_gate_widened_runs_more_at_once():
    gate = Gate(1)
    load = Counting(barrier=threading.Barrier(5))
    gate.resize(5)
    assert [f.result(WAIT_S) for f in [gate.submit(load, i) for i in range(10)]]
    assert load.most == 5
    gate.close()


def test_gate_close_cancels_what_waits_and_a_raise_is_the_futures():
    gate = Gate(1)
    hold = threading.Event()
    load = Counting(hold=hold, fail={0: 1})
    running = gate.submit(load, 0)
    assert load.started.acquire(timeout=WAIT_S)
    waiting = [gate.submit(load, i) for i in (1, 2)]
    gate.close()
    hold.set()
    with pytest.raises(ValueError, match="item 0 failed"):
        running.result(WAIT_S)
    assert all(f.cancelled() for f in waiting) and load.calls[1] == load.calls[2] == 0
    with pytest.raises(RuntimeError, match="closed"):
        gate.submit(load, 3)
    with pytest.raises(ValueError):
        Gate(0)


# -- InFlight --------------------------------------------------------------------------------------
def test_a_batch_loads_at_once_in_order_each_item_once():
    fl = InFlight(Plain(), at(4))
    load = Counting(barrier=threading.Barrier(4))
    shown = []
    out = fl.map(load, list(range(16)), progress=shown.append)
    assert values(out) == [i * 10 for i in range(16)]
    assert load.most == 4 and set(load.calls.values()) == {1}
    assert shown[0] == 4 and len(shown) == 17 and shown[-1] == 0
    fl.close()


def test_one_thread_loads_on_the_callers_thread():
    fl = InFlight(Plain(), at(1))
    seen = []
    out = fl.map(lambda i: seen.append(threading.get_ident()) or i, [1, 2, 3])
    assert values(out) == [1, 2, 3] and set(seen) == {threading.get_ident()}
    assert not fl.concurrent
    fl.close()


def test_a_raise_is_its_items_outcome_and_the_others_load():
    fl = InFlight(Plain(), at(4))
    load = Counting(fail={2: 1})
    out = fl.map(load, list(range(6)))
    assert [ok for ok, _, _ in out] == [True, True, False, True, True, True]
    assert isinstance(out[2][2], ValueError) and out[2][1] is None
    fl.close()


def test_widening_lets_more_load_at_once():
    fl = InFlight(Plain(), at(2))
    narrow = Counting()
    fl.map(narrow, list(range(8)))
    assert narrow.most <= 2
    fl.width.now = 6  # as "auto" widens
    wide = Counting(barrier=threading.Barrier(6))
    assert values(fl.map(wide, list(range(12)))) == [i * 10 for i in range(12)]
    assert wide.most == 6
    fl.close()


def _two_batches(fl, load, narrow_to=None):
    """Batch 0 loads with the next (1) started ahead when its first sample is done; the width
    becomes `narrow_to` in between (as "auto" settling). Returns both outcomes."""
    started = []
    batch = fl.start(load, list(range(8)), key=0, progress=lambda n: None)
    for free in batch:  # (as the worker loop reads ahead)
        if free > 0 and not started:
            started.append(True)
            fl.start_ahead(1, load, list(range(8, 16)))
    first = batch.outcomes()
    assert started
    if narrow_to is not None:
        fl.width.now = narrow_to
    second = fl.map(load, list(range(8, 16)), key=1, progress=lambda n: None)
    return first, second


def test_a_batch_started_ahead_is_taken_up_and_bounded_by_the_width():
    fl = InFlight(Plain(), at(12))
    load = Counting()
    first, second = _two_batches(fl, load)
    assert values(first + second) == [i * 10 for i in range(16)]
    assert set(load.calls.values()) == {1} and len(load.calls) == 16
    assert load.most <= 12 and fl.peak <= 12
    fl.close()


def test_narrowed_to_one_with_a_batch_ahead_loads_it_once():
    """The bug of the pool-per-width InFlight: settled at one thread with the next batch already
    started, that batch was loaded a second time on the main thread."""
    fl = InFlight(Plain(), at(8))
    load = Counting()
    first, second = _two_batches(fl, load, narrow_to=1)
    assert values(second) == [i * 10 for i in range(8, 16)]
    assert set(load.calls.values()) == {1} and len(load.calls) == 16
    fl.close()


def test_narrowing_bounds_what_starts_after():
    """Narrowed from 8 to 2 while a batch loads: the next batch's samples (started ahead) start
    only while fewer than 2 load, whatever was in flight before."""
    fl = InFlight(Plain(), at(8))
    ahead = threading.Event()
    load = Counting(hold=ahead, held=set(range(1, 8)))  # 7 in flight when the next starts
    batch = fl.start(load, list(range(8)), key=0, progress=lambda n: None)
    for free in batch:
        if free > 0 and not ahead.is_set():
            fl.width.now = 2
            fl.start_ahead(1, load, list(range(8, 16)))
            ahead.set()
    batch.outcomes()
    fl.map(load, list(range(8, 16)), key=1)
    assert max(load.at_start[i] for i in range(8, 16)) <= 2, load.at_start
    assert set(load.calls.values()) == {1} and len(load.calls) == 16
    fl.close()


def test_drop_ahead_cancels_what_has_not_started():
    fl = InFlight(Plain(), at(1))
    fl.width.now = 2
    hold = threading.Event()
    load = Counting(hold=hold)
    fl.start_ahead(5, load, list(range(6)))
    for _ in range(2):
        assert load.started.acquire(timeout=WAIT_S)
    hold.set()
    fl.drop_ahead()  # waits for the two running, cancels the rest
    # a load handed to the gate now runs after whatever still waited there (first in, first
    # out): had the four not been cancelled, they would have run before it
    assert values(fl.map(load, [98, 99])) == [980, 990]
    assert sorted(load.calls) == [0, 1, 98, 99]
    fl.close()


def _forked_copy_of(fl: InFlight) -> None:
    """What a fork makes of `fl` (its gate's threads are the parent's): the gate's maker is
    another process."""
    fl._gate._pid = -1  # noqa: SLF001 (as Gate.usable() sees a copy)


def test_a_forked_copy_forgets_what_was_started_ahead_without_waiting():
    fl = InFlight(Plain(), at(1))
    fl.width.now = 2
    hold = threading.Event()
    load = Counting(hold=hold, held=set(range(4)))
    fl.start_ahead(5, load, list(range(4)))
    for _ in range(2):
        assert load.started.acquire(timeout=WAIT_S)
    gate = fl._gate  # noqa: SLF001
    _forked_copy_of(fl)
    dropping = threading.Thread(target=fl.drop_ahead, daemon=True)
    dropping.start()
    dropping.join(WAIT_S)  # (waiting on the parent's loads would never end in a real copy)
    assert not dropping.is_alive()
    # one at a time, the copy does not wait for a place at the parent's gate (two places
    # taken by loads that are the parent's)
    alone = threading.Thread(target=lambda: fl.map(load, [50], serial=True), daemon=True)
    alone.start()
    alone.join(WAIT_S)
    assert not alone.is_alive() and load.calls[50] == 1
    hold.set()
    gate.close()


# -- the default: async datasets run concurrently ---------------------------------------------------
def test_unset_threads_mean_one_for_a_plain_dataset_and_auto_for_an_async_one():
    assert threads_for(None, Plain()) == 1
    assert threads_for(None, Async()) == "auto"
    assert threads_for(1, Async()) == 1 and threads_for(7, Plain()) == 7
    assert InFlight(Async(), at(None, Async())).width.auto
    plain = InFlight(Plain(), at(None, Plain()))
    assert not plain.width.auto and plain.width.now == 1
    assert InFlight(Async(), at(1)).width.now == 1 and not InFlight(Async(), at(1)).width.auto


def test_an_async_dataset_unset_awaits_many_at_once():
    fl = InFlight(Async(), at(None, Async()))
    now = most = 0
    both = None

    async def one(i):
        nonlocal now, most, both
        if both is None:
            both = asyncio.Event()
        now += 1
        most = max(most, now)
        if now >= 4:
            both.set()
        await asyncio.wait_for(both.wait(), WAIT_S)
        now -= 1
        return i

    out = fl.map(one, list(range(16)))
    assert values(out) == list(range(16)) and most >= 4
    fl.close()


# -- the policies over it (fetch.MapFetcher, as a worker uses it) ------------------------------------
class Flaky:
    """Index 3 raises its first `fails` times; every call counted."""

    def __init__(self, fails):
        self.fails = fails
        self.calls: collections.Counter = collections.Counter()
        self.lock = threading.Lock()

    def __getitem__(self, i):
        with self.lock:
            self.calls[i] += 1
            failing = i == 3 and self.fails > 0
            if failing:
                self.fails -= 1
        if failing:
            raise OSError(f"index {i} unreadable")
        return i


def test_skip_drops_the_sample_and_records_it():
    ds = Flaky(fails=99)
    f = MapFetcher(ds, True, LoadSettings("skip", 3, 4))
    assert f.fetch(list(range(8)), task=0) == [0, 1, 2, 4, 5, 6, 7]
    assert f.skipped == [(3, "OSError: index 3 unreadable")]
    assert set(ds.calls.values()) == {1}
    with pytest.raises(AllSkipped):
        MapFetcher(Flaky(fails=99), True, LoadSettings("skip", 3, 4)).fetch([3, 3])
    f.close()


def test_retry_loads_the_failing_sample_again_alone():
    ds = Flaky(fails=2)
    f = MapFetcher(ds, True, LoadSettings("retry", 3, 4))
    assert f.fetch(list(range(8)), task=0) == list(range(8))
    assert ds.calls[3] == 3 and all(ds.calls[i] == 1 for i in range(8) if i != 3)
    f.close()
    ds = Flaky(fails=9)
    f = MapFetcher(ds, True, LoadSettings("retry", 2, 4))
    with pytest.raises(OSError, match="index 3"):
        f.fetch(list(range(8)), task=0)
    assert ds.calls[3] == 3
    f.close()


def test_raise_raises_the_first_failure_in_sampler_order():
    ds = Flaky(fails=1)
    f = MapFetcher(ds, True, LoadSettings("raise", 3, 4))
    with pytest.raises(OSError, match="index 3"):
        f.fetch(list(range(8)), task=0)
    f.close()


# -- what the review found ----------------------------------------------------------------------------
def test_a_gate_no_one_holds_ends_its_threads():
    """A single-process iterator makes an InFlight per epoch and never closes it: its gate's
    threads end as it is collected (they held the gate before, and piled up epoch after epoch)."""
    import gc

    def live():
        return [t for t in threading.enumerate() if t.name.startswith("leak-check_")]

    for _ in range(3):
        gate = Gate(4, name="leak-check")
        assert [f.result(WAIT_S) for f in [gate.submit(lambda i: i, i) for i in range(8)]]
        assert gate.threads >= 1
        del gate
        gc.collect()
    for t in live():
        t.join(WAIT_S)
    assert not live()


def test_a_retry_on_the_callers_thread_counts_against_the_width():
    """A sample retried one at a time on the worker's main thread (its status page names it)
    while the next batch, started ahead, loads on the gate: never more than the width at once."""
    fl = InFlight(Plain(), at(2))
    hold = threading.Event()
    load = Counting(hold=hold, held={10, 11})
    fl.start_ahead(1, load, [10, 11])  # two places taken
    for _ in range(2):
        assert load.started.acquire(timeout=WAIT_S)
    done = []
    retry = threading.Thread(target=lambda: done.append(fl.map(load, [3], serial=True)))
    retry.start()
    assert not load.started.acquire(timeout=0.2)  # (it waits for a place: a bound, no timing)
    assert load.calls[3] == 0
    hold.set()
    retry.join(WAIT_S)
    assert values(done[0]) == [30] and load.most == 2
    assert values(fl.map(load, [10, 11], key=1)) == [100, 110]
    assert set(load.calls.values()) == {1}
    fl.close()


def test_the_interpreter_exits_with_a_gate_open():
    """A gate nobody closed (a single-process loader's, say) is closed as the interpreter exits:
    its threads end before finalization (as daemons they could be inside torch's C++ code then,
    and abort the process), and an idle gate does not keep the process from exiting."""
    from stoker.worker import gate as gate_module

    g = Gate(3)
    assert [f.result(WAIT_S) for f in [g.submit(lambda i: i, i) for i in range(6)]]
    gate_module._close_all()  # what threading's exit hook calls  # noqa: SLF001
    assert not g.usable()
    for t in [t for t in threading.enumerate() if t.name.startswith("stoker-sample_")]:
        t.join(WAIT_S)
        assert not t.is_alive()
