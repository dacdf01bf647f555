"""The two fetchers (worker/fetch.py) and their one retry rule, ``attempt``: raise, skip,
retry, and StopIteration, which ends a stream but is an ordinary error of a map-style
dataset. No process: the fetchers run on the test's thread."""

from __future__ import annotations

import pytest

from stoker.config.load import LoadSettings
from stoker.worker.fetch import AllSkipped, MapFetcher, StreamFetcher, attempt, fetcher_for

pytestmark = pytest.mark.unit


class Fails:
    """A load that raises `errors` one after the other, then returns "ok"; counts calls."""

    def __init__(self, *errors):
        self.errors = list(errors)
        self.calls = 0

    def __call__(self):
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


# -- the rule ----------------------------------------------------------------------------------
def test_raise_raises_the_first_error_without_retrying():
    load = Fails(OSError("a"))
    with pytest.raises(OSError, match="a"):
        attempt(load, LoadSettings("raise", 5))
    assert load.calls == 1


def test_skip_returns_the_error_without_retrying():
    load = Fails(OSError("a"))
    ok, error = attempt(load, LoadSettings("skip", 5))
    assert not ok and isinstance(error, OSError) and load.calls == 1


def test_retry_tries_max_retries_more_times_then_raises_the_last():
    load = Fails(OSError("1"), OSError("2"), OSError("3"))
    assert attempt(load, LoadSettings("retry", 3)) == (True, "ok") and load.calls == 4
    load = Fails(OSError("1"), OSError("2"), OSError("3"))
    with pytest.raises(OSError, match="3"):
        attempt(load, LoadSettings("retry", 2))
    assert load.calls == 3
    load = Fails(OSError("1"))
    with pytest.raises(OSError, match="1"):
        attempt(load, LoadSettings("retry", 0))
    assert load.calls == 1


def test_a_first_failure_made_elsewhere_leaves_only_the_retries():
    load = Fails(OSError("2"))
    assert attempt(load, LoadSettings("retry", 2), failed=OSError("1")) == (True, "ok")
    assert load.calls == 2
    load = Fails()
    with pytest.raises(OSError, match="1"):
        attempt(load, LoadSettings("raise"), failed=OSError("1"))
    assert load.calls == 0
    ok, error = attempt(load, LoadSettings("skip"), failed=OSError("1"))
    assert not ok and str(error) == "1" and load.calls == 0


def test_stop_iteration_from_a_map_load_is_an_ordinary_error():
    load = Fails(StopIteration(), StopIteration())
    assert attempt(load, LoadSettings("retry", 2)) == (True, "ok") and load.calls == 3
    ok, error = attempt(Fails(StopIteration()), LoadSettings("skip"))
    assert not ok and isinstance(error, StopIteration)
    load = Fails(OSError("first"), StopIteration())
    with pytest.raises(StopIteration):  # retried, and the last failure raised
        attempt(load, LoadSettings("retry", 1))


def test_stop_iteration_from_a_stream_ends_it_but_never_drops_a_failure():
    for policy in ("raise", "skip", "retry"):
        load = Fails(StopIteration())
        with pytest.raises(StopIteration):  # its end: no retry, no skip
            attempt(load, LoadSettings(policy, 3), stream=True)
        assert load.calls == 1
    load = Fails(OSError("broken"), StopIteration())
    with pytest.raises(OSError, match="broken"):  # ended behind the failure: it stands
        attempt(load, LoadSettings("retry", 3), stream=True)
    assert load.calls == 2


# -- the map fetcher -----------------------------------------------------------------------------
class Stops:
    """A map-style dataset whose index 3 raises StopIteration its first `times` calls."""

    def __init__(self, times):
        self.times = times

    def __getitem__(self, i):
        if i == 3 and self.times > 0:
            self.times -= 1
            raise StopIteration
        return i


@pytest.mark.parametrize("threads", [1, 4])
def test_the_map_fetcher_skips_or_retries_a_stop_iteration(threads):
    f = MapFetcher(Stops(99), True, LoadSettings("skip", 3, threads))
    assert f.fetch(list(range(6)), task=0) == [0, 1, 2, 4, 5]
    assert f.skipped == [(3, "StopIteration: ")]
    f.close()
    f = MapFetcher(Stops(2), True, LoadSettings("retry", 2, threads))
    assert f.fetch(list(range(6)), task=0) == list(range(6))
    f.close()
    f = MapFetcher(Stops(1), True, LoadSettings("raise", 3, threads))
    with pytest.raises(StopIteration):
        f.fetch(list(range(6)), task=0)
    assert f.current == 3
    f.close()


def test_the_map_fetcher_one_index_at_a_time():
    f = MapFetcher(Stops(99), False, LoadSettings("skip"))
    with pytest.raises(AllSkipped):
        f.fetch(3)
    assert f.fetch(2) == 2 and f.skipped == []


# -- the stream fetcher --------------------------------------------------------------------------
class Stream:
    """Yields 0.. `n`-1; item `bad` raises OSError once (the iterator goes on after it)."""

    def __init__(self, n, bad=None):
        self.n, self.bad = n, bad

    def __iter__(self):
        return _It(self.n, self.bad)


class _It:
    def __init__(self, n, bad):
        self.i, self.n, self.bad = 0, n, bad

    def __iter__(self):
        return self

    def __next__(self):
        if self.i >= self.n:
            raise StopIteration
        i = self.i
        if i == self.bad:
            self.bad = None
            raise OSError(f"item {i}")
        self.i += 1
        return i


def _generator(n, bad):
    for i in range(n):
        if i == bad:
            raise OSError(f"item {i}")  # (a generator that raised is finished)
        yield i


class Generated:
    def __init__(self, n, bad):
        self.n, self.bad = n, bad

    def __iter__(self):
        return _generator(self.n, self.bad)


def test_the_stream_fetcher_ends_at_stop_iteration_and_counts_its_place():
    f = StreamFetcher(Stream(5), True, False, LoadSettings())
    assert f.fetch([None] * 3) == [0, 1, 2] and f.stream_pos == 3
    assert f.fetch([None] * 3) == [3, 4] and f.ended
    with pytest.raises(StopIteration):
        f.fetch([None] * 3)
    f = StreamFetcher(Stream(5), True, True, LoadSettings())  # drop_last
    f.fetch([None] * 3)
    with pytest.raises(StopIteration):
        f.fetch([None] * 3)


def test_the_stream_fetcher_retries_an_item_that_can_be_drawn_again():
    f = StreamFetcher(Stream(4, bad=1), True, False, LoadSettings("retry", 1))
    assert f.fetch([None] * 4) == [0, 1, 2, 3]
    f = StreamFetcher(Stream(4, bad=1), True, False, LoadSettings("skip"))
    assert f.fetch([None] * 4) == [0, 1, 2] and f.skipped == [(None, "OSError: item 1")]


def test_a_stream_ended_behind_a_retried_failure_raises_it():
    f = StreamFetcher(Generated(4, bad=1), True, False, LoadSettings("retry", 3))
    with pytest.raises(OSError, match="item 1"):
        f.fetch([None] * 4)
    with pytest.raises(StopIteration):  # then its end, as torch's next fetch sees it
        f.fetch([None] * 4)
    f = StreamFetcher(Generated(4, bad=1), True, False, LoadSettings("skip"))
    assert f.fetch([None] * 4) == [0] and f.ended and f.skipped == [(None, "OSError: item 1")]


class FailsThenEndsThenGoesOn:
    """A hand-written iterator (not a generator): item 1 raises, then it says StopIteration,
    and, asked again after that, it would go on with items it should never give."""

    def __init__(self):
        self.calls = 0

    def __iter__(self):
        return self

    def __next__(self):
        self.calls += 1
        if self.calls == 1:
            return 0
        if self.calls == 2:
            raise OSError("item 1")
        if self.calls == 3:
            raise StopIteration
        return 99


def test_a_stream_ended_behind_a_retried_failure_is_not_asked_again():
    it = FailsThenEndsThenGoesOn()
    f = StreamFetcher(it, True, False, LoadSettings("retry", 3))
    with pytest.raises(OSError, match="item 1"):
        f.fetch([None] * 4)
    assert f.ended and it.calls == 3
    with pytest.raises(StopIteration):
        f.fetch([None] * 4)
    assert it.calls == 3  # its end was recorded: no item after it


def test_skip_all_records_every_sample_of_a_batch_that_could_not_be_collated():
    f = MapFetcher([1, 2, 3], True, LoadSettings("skip"))
    f.skip_all([0, 2], "collate failed: TypeError: x")
    assert f.current == [0, 2]
    assert f.skipped == [(0, "collate failed: TypeError: x"), (2, "collate failed: TypeError: x")]
    f.skip_all(None, "collate failed")  # a stream's item has no index
    assert f.skipped == [(None, "collate failed")]


def test_fetcher_for_picks_by_kind():
    assert type(fetcher_for(0, [1], True, False, LoadSettings())) is MapFetcher
    assert type(fetcher_for(1, Stream(1), True, False, LoadSettings())) is StreamFetcher
