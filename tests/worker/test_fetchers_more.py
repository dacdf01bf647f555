"""What the fetchers (worker/fetch.py) show the worker loop and the single-process iterator,
beyond the policy itself (test_fetchers.py): the samples and their order on every path (one
by one, at once on threads, ``__getitems__``, an async dataset, one index without
auto-collation), what is skipped and recorded, ``current``, the callbacks ``on_sample`` and
``on_batch``, ``Loading.at_once``, the look-ahead (``loads_at_once``, ``start_ahead``), and a
stream's ``stream_pos``, ``ended`` and ``drop_last``. No process: the fetchers run on the
test's thread, their loads on it or on a gate's threads."""

from __future__ import annotations

import asyncio
import threading

import pytest

from stoker.config.load import LoadSettings
from stoker.worker.fetch import (
    ITERABLE,
    MAP,
    AllSkipped,
    Loading,
    MapFetcher,
    StreamFetcher,
    fetcher_for,
)
from stoker.worker.inflight import InFlight

pytestmark = pytest.mark.unit


class Items:
    """A map-style dataset: index i is i * 10; the indices in `bad` raise OSError (each its
    first `times` calls); records on which thread each index loaded."""

    def __init__(self, bad=(), times=99):
        self.bad = {i: times for i in bad}
        self.threads: dict = {}
        self.calls: list = []
        self.lock = threading.Lock()

    def __getitem__(self, i):
        with self.lock:
            self.calls.append(i)
            self.threads[i] = threading.get_ident()
            if self.bad.get(i, 0) > 0:
                self.bad[i] -= 1
                raise OSError(f"bad {i}")
        return i * 10

    def __len__(self):
        return 100


class Batches(Items):
    """Items with torch's batched fetch: ``__getitems__`` gives a whole list at once (each
    sample i * 10 + 1, so that a sample loaded by ``__getitem__`` instead shows); a list
    holding a bad index raises (each its first `times` calls)."""

    def __init__(self, bad=(), times=99):
        super().__init__(bad, times)
        self.batches: list = []

    def __getitems__(self, idx):
        self.batches.append(list(idx))
        for i in idx:
            if self.bad.get(i, 0) > 0:
                self.bad[i] -= 1
                raise OSError(f"bad {i}")
        return [i * 10 + 1 for i in idx]


class AsyncItems:
    """An async map-style dataset (``async def __getitem__``); records the event loop of
    each sample."""

    def __init__(self):
        self.loops: list = []

    async def __getitem__(self, i):
        self.loops.append(asyncio.get_running_loop())
        await asyncio.sleep(0)
        return i * 10

    def __len__(self):
        return 100


class AsyncBatches:
    """An async ``__getitems__`` (no ``__getitem__``): a list holding a bad index raises."""

    def __init__(self, bad=()):
        self.bad = set(bad)
        self.loops: list = []
        self.batches: list = []

    async def __getitems__(self, idx):
        self.loops.append(asyncio.get_running_loop())
        self.batches.append(list(idx))
        await asyncio.sleep(0)
        if self.bad & set(idx):
            raise OSError("bad")
        return [i * 10 + 1 for i in idx]


class Stream:
    """Yields 0.. `n`-1; the items in `bad` raise OSError once each (the iterator goes on)."""

    def __init__(self, n, bad=()):
        self.n, self.bad = n, set(bad)

    def __iter__(self):
        return _It(self.n, set(self.bad))


class _It:
    def __init__(self, n, bad):
        self.i, self.n, self.bad = 0, n, bad

    def __iter__(self):
        return self

    def __next__(self):
        if self.i >= self.n:
            raise StopIteration
        i = self.i
        self.i += 1
        if i in self.bad:
            raise OSError(f"item {i}")
        return i


class Calls:
    """A callback that records its arguments (from any thread)."""

    def __init__(self, fail_first=None):
        self.calls: list = []
        self.fail_first = fail_first

    def __call__(self, *args):
        self.calls.append(args)
        if self.fail_first is not None and len(self.calls) == 1:
            raise self.fail_first


@pytest.fixture
def closing():
    """Fetchers made in a test, closed after it (their threads end)."""
    made: list = []
    yield made.append
    for f in made:
        f.close()


def _map(closing, dataset, settings, auto_collation=True, **kw) -> MapFetcher:
    f = MapFetcher(dataset, auto_collation, settings, **kw)
    closing(f)
    return f


# -- one by one ----------------------------------------------------------------------------------
def test_one_by_one_names_each_sample_as_it_starts_and_the_batch_once_done(closing):
    ds, on_sample = Items(bad=[2]), Calls()
    f = _map(closing, ds, LoadSettings("skip"), on_sample=on_sample)
    loading = f.begin([3, 2, 1])
    assert not loading.at_once and list(loading) == []  # nothing loads at once: no look-ahead
    assert loading.result() == [30, 10]
    assert on_sample.calls == [(3, 0, None), (2, 1, None), (1, 2, None)]
    assert f.skipped == [(2, "OSError: bad 2")] and f.current == [3, 2, 1]
    assert ds.calls == [3, 2, 1]


def test_one_index_without_auto_collation(closing):
    on_sample = Calls()
    f = _map(closing, Items(bad=[4]), LoadSettings("skip", threads=2), auto_collation=False,
             on_sample=on_sample)
    assert f.fetch(5) == 50 and f.current == 5 and f.skipped == []
    with pytest.raises(AllSkipped):
        f.fetch(4)
    assert f.skipped == [(4, "OSError: bad 4")] and f.current == 4
    assert on_sample.calls == [(5, 0, None), (4, 0, None)]
    assert not f.loads_at_once(5)  # one index is never started ahead


def test_a_fresh_fetcher_names_no_sample_and_has_skipped_none():
    # (the loop reports `current` for an error raised before any sample started)
    f = MapFetcher(Items(), True, LoadSettings())
    assert f.current is None and f.skipped == []
    f.close()
    s = StreamFetcher(Stream(1), True, False, LoadSettings())
    assert s.current is None and s.skipped == [] and s.ended is False and s.stream_pos == 0
    s.close()  # a stream has no threads: closing it is nothing


# -- at once on threads ------------------------------------------------------------------------
def test_a_batch_loads_on_the_threads_and_says_so(closing):
    ds, on_sample, on_batch = Items(), Calls(), Calls()
    f = _map(closing, ds, LoadSettings(threads=2), on_sample=on_sample, on_batch=on_batch)
    loading = f.begin([4, 3, 2, 1], task=0)
    assert loading.at_once
    assert loading.result() == [40, 30, 20, 10]
    assert not loading.at_once  # done: a retry now loads on its own
    assert f.current == [4, 3, 2, 1] and f.skipped == []
    assert sorted(on_sample.calls) == [(1, 3, None), (2, 2, None), (3, 1, None), (4, 0, None)]
    me = threading.get_ident()
    assert all(t != me for t in ds.threads.values())
    idx = [4, 3, 2, 1]
    assert on_batch.calls == [(idx, 2), (idx, 2), (idx, 2), (idx, 1), (idx, 0), (None, 0)]


def test_fetch_loads_at_once_unless_serial(closing):
    ds, on_batch = Items(), Calls()
    f = _map(closing, ds, LoadSettings(threads=4), on_batch=on_batch)
    assert f.fetch([0, 1, 2]) == [0, 10, 20]
    me = threading.get_ident()
    assert all(ds.threads[i] != me for i in (0, 1, 2))
    ds.threads.clear()
    on_batch.calls.clear()
    assert f.fetch([0, 1, 2], 7, serial=True) == [0, 10, 20]  # one at a time, here
    assert all(ds.threads[i] == me for i in (0, 1, 2))
    assert on_batch.calls == [([0, 1, 2], 0)] * 4 + [(None, 0)]
    loading = f.begin([0, 1], 8, serial=True)
    assert not loading.at_once
    assert loading.result() == [0, 10]


def test_at_once_means_more_than_one_sample_loading(closing):
    f = _map(closing, Items(), LoadSettings(threads=4))
    loading = f.begin([0, 1], 0)  # min(width, batch) = 2
    assert loading.at_once and loading.result() == [0, 10]
    a = _map(closing, AsyncItems(), LoadSettings(threads=1))  # one coroutine at a time
    loading = a.begin([0, 1, 2], 0)
    assert not loading.at_once and loading.result() == [0, 10, 20]


def test_a_batch_of_one_is_not_a_batch_loading_at_once(closing):
    ds, on_batch = Items(), Calls()
    f = _map(closing, ds, LoadSettings(threads=2), on_batch=on_batch)
    assert f.fetch([5], 0) == [50]
    assert on_batch.calls == [] and ds.threads[5] == threading.get_ident()


def test_a_failure_at_once_is_retried_on_its_own_named(closing):
    ds = Items(bad=[2], times=1)
    loadings: list = []
    seen: list = []
    me = threading.get_ident()

    def on_sample(index, position, stream_pos):
        if threading.get_ident() == me:  # as the loop does: the status page names it then
            seen.append((index, position, loadings[0].at_once))

    f = _map(closing, ds, LoadSettings("retry", 2, threads=2), on_sample=on_sample)
    loadings.append(f.begin([1, 2, 3], 0))
    assert loadings[0].result() == [10, 20, 30]
    assert seen == [(2, 1, False)]  # the retry, on this thread, no longer "at once"
    assert ds.calls.count(2) == 2 and f.current == [1, 2, 3]


def test_a_batch_that_cannot_start_says_it_is_over(closing):
    on_batch = Calls(fail_first=RuntimeError("status page"))
    f = _map(closing, Items(), LoadSettings(threads=2), on_batch=on_batch)
    with pytest.raises(RuntimeError, match="status page"):
        f.begin([0, 1], 0)
    assert on_batch.calls == [([0, 1], 2), (None, 0)]
    assert f.current == [0, 1]


def test_an_error_starting_a_batch_names_that_batch_not_the_one_before(closing):
    # (the loop reports `current` with the error: "while loading dataset index ...")
    on_batch = Calls()
    f = _map(closing, Items(), LoadSettings(threads=2), on_batch=on_batch)
    assert f.fetch([0, 1], 0) == [0, 10] and f.current == [0, 1]
    on_batch.calls.clear()
    on_batch.fail_first = RuntimeError("can't start new thread")
    with pytest.raises(RuntimeError, match="new thread"):
        f.begin([2, 3], 1)
    assert f.current == [2, 3]


def test_a_batch_started_ahead_is_taken_up_by_its_task(closing):
    ds = Items()
    f = _map(closing, ds, LoadSettings(threads=2))
    assert f.loads_at_once([5, 6, 7])
    f.start_ahead(3, [5, 6, 7])
    assert f.fetch([5, 6, 7], 3) == [50, 60, 70]
    assert sorted(ds.calls) == [5, 6, 7]  # each loaded once


def test_which_tasks_load_at_once(closing):
    assert _map(closing, Items(), LoadSettings(threads=2)).loads_at_once([0, 1])
    assert _map(closing, Items(), LoadSettings(threads=4)).loads_at_once([0, 1])
    assert not _map(closing, Items(), LoadSettings(threads=2)).loads_at_once([0])
    assert not _map(closing, Items(), LoadSettings(threads=1)).loads_at_once([0, 1, 2])
    assert not _map(closing, Items(), LoadSettings(threads=2),
                    auto_collation=False).loads_at_once(3)
    assert not _map(closing, Batches(), LoadSettings(threads=2)).loads_at_once([0, 1])
    assert not _map(closing, AsyncItems(), LoadSettings(threads=2)).loads_at_once([0, 1])


def test_a_carried_inflight_is_the_fetchers_and_its_loop_goes_on(closing):
    ds = AsyncItems()
    fl = InFlight(ds, LoadSettings(threads=2))
    f = _map(closing, ds, LoadSettings(threads=2), auto_collation=False, carried=fl)
    assert f.inflight is fl
    assert f.fetch(1) == 10 and f.fetch(2) == 20
    on_batch = Calls()
    g = fetcher_for(MAP, ds, True, False, LoadSettings(threads=2), on_batch=on_batch, carried=fl)
    assert g.inflight is fl
    assert g.fetch([3, 4], 0) == [30, 40]
    assert on_batch.calls[-1] == (None, 0) and on_batch.calls[0][0] == [3, 4]
    assert len(ds.loops) == 4 and all(loop is ds.loops[0] for loop in ds.loops)


def test_an_async_dataset_awaits_its_samples(closing):
    ds = AsyncItems()
    f = _map(closing, ds, LoadSettings(threads=1))
    assert f.fetch([1, 2], 0) == [10, 20]
    assert f.fetch([3], 1) == [30]


# -- __getitems__ --------------------------------------------------------------------------------
@pytest.mark.parametrize("threads", [1, 2])
def test_getitems_loads_a_batch_in_one_call(closing, threads):
    ds, on_sample = Batches(), Calls()
    f = _map(closing, ds, LoadSettings(threads=threads), on_sample=on_sample)
    assert f.fetch([3, 1, 2], 0) == [31, 11, 21]
    assert ds.batches == [[3, 1, 2]] and ds.calls == []
    assert on_sample.calls == [([3, 1, 2], None, None)] and f.current == [3, 1, 2]


def test_getitems_raises_a_failing_batch_as_it_is_under_raise(closing):
    ds = Batches(bad=[2])
    f = _map(closing, ds, LoadSettings("raise"))
    with pytest.raises(OSError, match="bad 2"):
        f.fetch([1, 2, 3], 0)
    assert ds.batches == [[1, 2, 3]] and f.current == [1, 2, 3]


def test_getitems_finds_the_culprit_sample_by_sample(closing):
    ds, on_sample = Batches(bad=[2]), Calls()
    f = _map(closing, ds, LoadSettings("skip"), on_sample=on_sample)
    assert f.fetch([1, 2, 3], 0) == [11, 31]
    assert ds.batches == [[1, 2, 3], [1], [2], [3]]
    assert f.skipped == [(2, "OSError: bad 2")] and f.current == [1, 2, 3]
    assert on_sample.calls == [([1, 2, 3], None, None), (1, 0, None), (2, 1, None),
                               (3, 2, None)]
    with pytest.raises(AllSkipped):
        f.fetch([2], 1)
    assert f.skipped == [(2, "OSError: bad 2")]


def test_getitems_retries_a_sample_that_failed_in_its_batch(closing):
    ds = Batches(bad=[2], times=2)  # the batch, then the sample once: the retry loads it
    f = _map(closing, ds, LoadSettings("retry", 1))
    assert f.fetch([1, 2, 3], 0) == [11, 21, 31]
    assert ds.batches == [[1, 2, 3], [1], [2], [2], [3]] and f.skipped == []


def test_an_async_getitems_is_awaited_on_the_workers_loop(closing):
    ds = AsyncBatches(bad=[2])
    f = _map(closing, ds, LoadSettings("skip"))
    assert f.fetch([0, 1], 0) == [1, 11]
    assert f.fetch([1, 2, 3], 1) == [11, 31]
    assert f.skipped == [(2, "OSError: bad")]
    assert ds.batches == [[0, 1], [1, 2, 3], [1], [2], [3]]
    assert all(loop is ds.loops[0] for loop in ds.loops)
    r = _map(closing, AsyncBatches(), LoadSettings("raise"))
    assert r.fetch([4, 5], 0) == [41, 51]


# -- a stream ------------------------------------------------------------------------------------
def test_fetcher_for_a_stream_passes_everything_on():
    on_sample = Calls()
    f = fetcher_for(ITERABLE, Stream(5, bad=[1]), False, False, LoadSettings("skip"),
                    on_sample=on_sample, stream_pos=7)
    assert f.fetch(None) == 0  # one item (no auto-collation)
    with pytest.raises(AllSkipped):
        f.fetch(None)
    assert f.skipped == [(None, "OSError: item 1")]
    assert on_sample.calls == [(None, None, 7), (None, None, 8)] and f.stream_pos == 9
    f = fetcher_for(ITERABLE, Stream(4), True, True, LoadSettings())  # drop_last
    assert f.stream_pos == 0
    assert f.fetch([None] * 3) == [0, 1, 2]
    with pytest.raises(StopIteration):
        f.fetch([None] * 3)


def test_a_stream_item_without_auto_collation_ends_at_its_end():
    for policy in ("raise", "skip", "retry"):
        f = StreamFetcher(Stream(1), False, False, LoadSettings(policy))
        assert f.fetch(None) == 0 and not f.ended
        with pytest.raises(StopIteration):  # its end, whatever the policy
            f.fetch(None)
        assert f.ended
    f = StreamFetcher(Stream(2, bad=[0]), False, False, LoadSettings("raise"))
    with pytest.raises(OSError, match="item 0"):
        f.fetch(None)
    assert f.fetch(None) == 1


def test_a_stream_batch_all_skipped_before_its_end_is_dropped():
    f = StreamFetcher(Stream(5, bad=[0, 1]), True, False, LoadSettings("skip"))
    with pytest.raises(AllSkipped):
        f.fetch([None] * 2)
    assert not f.ended and len(f.skipped) == 2
    assert f.fetch([None] * 2) == [2, 3]
    assert f.fetch([None] * 2) == [4] and f.ended


def test_a_stream_that_ends_on_a_batch_boundary_ends_the_next_fetch():
    f = StreamFetcher(Stream(4), True, False, LoadSettings())
    assert f.fetch([None] * 2) == [0, 1] and f.fetch([None] * 2) == [2, 3]
    assert not f.ended
    with pytest.raises(StopIteration):
        f.fetch([None] * 2)
    assert f.ended


def test_a_stream_item_has_no_index():
    f = StreamFetcher(Stream(4), True, False, LoadSettings("skip"))
    f.skip_all([None, None], "collate failed")
    f.skip_all([1, 2], "collate failed")
    assert f.fetch([None] * 2) == [0, 1] and f.current is None and f.skipped == []


def test_a_loading_without_a_batch_yields_nothing():
    loading = Loading(lambda: "done")
    assert not loading.at_once and list(loading) == [] and loading.result() == "done"
