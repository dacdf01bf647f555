"""threads_per_worker: many samples in flight in each worker, with every promise kept (each
sample once, errors and deaths named with their sample, hangs with their stack)."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import tempfile
import threading
import time

import torch

import stoker
from scenario_datasets import KillsOnceAt, KillsSelfAt, RaisesAt, Squares
from scenarios import expect_raises
from scenarios.probes import leftovers


def labels(batches) -> list:
    return sorted(int(x) for b in batches for x in b[1])


class Waits(Squares):
    """Each sample waits `ms` (a network read)."""

    def __init__(self, n=64, ms=20):
        super().__init__(n)
        self.ms = ms

    def __getitem__(self, i):
        time.sleep(self.ms / 1000)
        return super().__getitem__(i)


class CountsAtOnce(Waits):
    """Waits, and says with each sample the most samples that loaded at once in its worker so
    far."""

    def __init__(self, n=64, ms=50):
        super().__init__(n, ms)
        self._lock = threading.Lock()
        self._now = self._most = 0

    def __getstate__(self):
        return {"n": self.n, "shape": self.shape, "ms": self.ms}

    def __setstate__(self, d):
        self.__init__(d["n"], d["ms"])

    def __getitem__(self, i):
        with self._lock:
            self._now += 1
            self._most = max(self._most, self._now)
        try:
            x, y = super().__getitem__(i)
        finally:
            with self._lock:
                self._now -= 1
        return x, y, self._most


class AsyncWaits(Squares):
    def __init__(self, n=64, ms=20):
        super().__init__(n)
        self.ms = ms

    async def __getitem__(self, i):
        await asyncio.sleep(self.ms / 1000)
        return torch.full(self.shape, float(i)), i


MEET_S = 60  # a sample that waits this long for others to load beside it has failed


class Meets(Squares):
    """Each sample waits until `parties` samples load at once in its worker (a barrier):
    fewer at once raises (threading.BrokenBarrierError) instead of being slower."""

    def __init__(self, parties, n=64):
        super().__init__(n)
        self.parties = parties
        self._barrier = threading.Barrier(parties, timeout=MEET_S)

    def __getstate__(self):
        return {"parties": self.parties, "n": self.n}

    def __setstate__(self, d):
        self.__init__(d["parties"], d["n"])

    def __getitem__(self, i):
        self._barrier.wait()
        return super().__getitem__(i)


class AsyncMeets(Meets):
    """Meets, for an async dataset: the k-th sample to start waits until the samples of its
    round of `parties` have all started."""

    def __init__(self, parties, n=64):
        super().__init__(parties, n)
        self._started = 0
        self._rounds: dict = {}

    async def __getitem__(self, i):
        k, self._started = self._started, self._started + 1
        rnd = k // self.parties
        ready = self._rounds.setdefault(rnd, asyncio.Event())
        if self._started >= (rnd + 1) * self.parties:
            ready.set()
        await asyncio.wait_for(ready.wait(), MEET_S)
        return torch.full(self.shape, float(i)), i


class _HeldFirstBatch(Waits):
    """Samples 1-7 (of the first batch of 8) wait until two samples of a later batch have
    started (else they wait MEET_S and raise)."""

    def __init__(self, n=64, ms=20):
        super().__init__(n, ms)
        self._later = threading.Condition()
        self._later_started = 0

    def __getitem__(self, i):
        if i >= 8:
            with self._later:
                self._later_started += 1
                self._later.notify_all()
        elif i > 0:
            with self._later:
                met = self._later.wait_for(lambda: self._later_started >= 2, MEET_S)
            if not met:
                raise TimeoutError(f"sample {i}: no sample of the next batch started while "
                                   "this batch loaded")
        return super().__getitem__(i)


class WaitsForTheNextBatch(CountsAtOnce, _HeldFirstBatch):
    """CountsAtOnce whose first batch ends only once the worker started its next task's
    samples while this one's loaded (so more than 8 were at once, counted)."""


class Drawn(Squares):
    """A random crop-like draw from a generator seeded with stoker.sample_seed()."""

    def __getitem__(self, i):
        time.sleep(0.002)
        g = torch.Generator().manual_seed(stoker.sample_seed())
        return torch.rand(3, generator=g), i


class AsyncDrawn(Squares):
    async def __getitem__(self, i):
        await asyncio.sleep(0.002)  # other samples' coroutines run meanwhile
        g = torch.Generator().manual_seed(stoker.sample_seed())
        return torch.rand(3, generator=g), i


class FromItsGenerator(Squares):
    """Two draws from stoker.sample_generator() with other samples' loads between them: the
    second goes on from the first, on the sample's own generator."""

    def __getitem__(self, i):
        g = stoker.sample_generator()
        a = torch.rand(2, generator=g)
        time.sleep(0.002)  # other threads draw from theirs meanwhile
        assert stoker.sample_generator() is g
        return torch.cat([a, torch.rand(2, generator=g)]), i


class AsyncFromItsGenerator(Squares):
    async def __getitem__(self, i):
        a = torch.rand(2, generator=stoker.sample_generator())
        await asyncio.sleep(0.002)  # other samples' coroutines draw meanwhile
        return torch.cat([a, torch.rand(2, generator=stoker.sample_generator())]), i


class LoopBound(Squares):
    """An async client bound to the event loop it was made on (as aiohttp's session is)."""

    def __init__(self, n=64):
        super().__init__(n)
        self._loop = None

    async def __getitem__(self, i):
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        if self._loop is not loop:
            raise RuntimeError("the client's event loop is gone: a new loop this epoch")
        await asyncio.sleep(0.001)
        return torch.full(self.shape, float(i)), i


class AsyncBatched(Squares):
    """An async __getitems__ (one request for the batch); sample 21 is corrupt."""

    async def __getitems__(self, idx):
        await asyncio.sleep(0.002)
        if 21 in idx:
            raise ValueError("cannot decode sample 21: corrupt file")
        return [(torch.full(self.shape, float(i)), i) for i in idx]


class AsyncSegfaults(KillsSelfAt):
    async def __getitem__(self, i):
        await asyncio.sleep(0.001)
        return KillsSelfAt.__getitem__(self, i)


class WaitsThenSegfaults(KillsSelfAt):
    def __getitem__(self, i):
        time.sleep(0.01)
        return super().__getitem__(i)


class WaitsThenKillsOnce(KillsOnceAt):
    def __getitem__(self, i):
        time.sleep(0.01)
        return super().__getitem__(i)


class HangsInAThread(Squares):
    def __getitem__(self, i):
        if i == 13:
            while True:
                time.sleep(0.05)
        time.sleep(0.005)
        return super().__getitem__(i)


def every_sample_once_in_order(async_dataset=False):
    """Threads (and an async dataset's coroutines) give the batches of one thread, in order,
    in a fraction of the time."""
    ds = AsyncWaits() if async_dataset else Waits()
    plain = [b[1].tolist() for b in stoker.DataLoader(Squares(), batch_size=8, num_workers=2)]
    for threads in (8, "auto"):
        dl = stoker.DataLoader(ds, batch_size=8, num_workers=2, threads_per_worker=threads)
        for _ in range(2):
            got = [b[1].tolist() for b in dl]
            assert got == plain, (threads, got)
    # num_workers=0 with threads (and an async dataset) too
    got = [b[1].tolist() for b in stoker.DataLoader(ds, batch_size=8, threads_per_worker=4)]
    assert got == plain, got
    # 16 at once: each batch's 16 samples wait for each other (a sample that waited
    # MEET_S for the others raises, and the loader with it): no clock is read
    meets = AsyncMeets(16) if async_dataset else Meets(16)
    got = [b[1].tolist() for b in stoker.DataLoader(meets, batch_size=16, num_workers=1,
                                                     threads_per_worker=16)]
    assert sorted(i for b in got for i in b) == list(range(64)), got


def next_batch_loads_while_the_last_samples_do():
    """A worker's next task (queued within prefetch_factor) starts its samples on the threads
    that the batch loading now leaves free: with 16 threads and batches of 8, up to 16 samples
    of two batches load at once (never more), and the batches are still those of one thread."""
    dl = stoker.DataLoader(WaitsForTheNextBatch(), batch_size=8, num_workers=1,
                           threads_per_worker=16, prefetch_factor=2)
    plain = [b[1].tolist() for b in stoker.DataLoader(Squares(), batch_size=8, num_workers=1)]
    got = list(dl)
    assert [b[1].tolist() for b in got] == plain
    most = max(int(m) for b in got for m in b[2])
    assert 8 < most <= 16, most


def bit_identical_under_per_sample_seed():
    """seed="per_sample" with stoker.sample_seed(): the same bits whatever the threads."""
    def run(threads, workers):
        dl = stoker.DataLoader(Drawn(), batch_size=8, num_workers=workers, shuffle=True,
                               seed="per_sample", threads_per_worker=threads,
                               generator=torch.Generator().manual_seed(7))
        return [b[0] for b in dl]

    base = run(1, 2)
    for threads, workers in ((8, 2), ("auto", 1), (4, 0)):
        other = run(threads, workers)
        assert len(other) == len(base)
        assert all(torch.equal(a, b) for a, b in zip(base, other)), (threads, workers)
    # an async dataset: each coroutine sees its own sample's seed across its awaits
    for threads, workers in ((8, 2), (4, 0)):
        dl = stoker.DataLoader(AsyncDrawn(), batch_size=8, num_workers=workers, shuffle=True,
                               seed="per_sample", threads_per_worker=threads,
                               generator=torch.Generator().manual_seed(7))
        other = [b[0] for b in dl]
        assert all(torch.equal(a, b) for a, b in zip(base, other)), ("async", threads)


def same_draws_from_sample_generator():
    """stoker.sample_generator() under seed="per_sample": the same draws whatever the threads,
    the workers, or a dataset that awaits between its draws; each sample's differ."""
    def run(dataset, threads, workers):
        dl = stoker.DataLoader(dataset, batch_size=8, num_workers=workers, shuffle=True,
                               seed="per_sample", threads_per_worker=threads,
                               generator=torch.Generator().manual_seed(7))
        return [b[0] for b in dl]

    base = run(FromItsGenerator(), 1, 2)
    rows = torch.cat(base)
    assert len({tuple(r.tolist()) for r in rows}) == len(rows) == 64  # each sample its own
    assert not torch.equal(rows[:, :2], rows[:, 2:])  # the second draw goes on from the first
    for dataset, threads, workers in ((FromItsGenerator(), 8, 2), (FromItsGenerator(), 4, 0),
                                      (FromItsGenerator(), "auto", 1),
                                      (AsyncFromItsGenerator(), 8, 2),
                                      (AsyncFromItsGenerator(), 4, 0)):
        other = run(dataset, threads, workers)
        assert all(torch.equal(a, b) for a, b in zip(base, other)), (dataset, threads, workers)
    # without seed="per_sample" there is no sample's generator: torch's global one is used
    plain = stoker.DataLoader(Squares(), batch_size=8)
    assert stoker.sample_generator() is None and len(list(plain)) == 8


def async_client_lives_with_the_worker():
    """Persistent workers keep their event loop across epochs: a loop-bound client keeps
    working (it would fail on a new loop each epoch)."""
    dl = stoker.DataLoader(LoopBound(), batch_size=8, num_workers=2, threads_per_worker=8,
                           persistent_workers=True)
    for _ in range(3):
        assert labels(list(dl)) == list(range(64))


def async_segfault_at_one_thread_quarantined():
    """An async dataset at threads_per_worker=1 loads one sample at a time: a death names it."""
    dl = stoker.DataLoader(AsyncSegfaults(21, signal.SIGSEGV), batch_size=8, num_workers=2,
                           on_error="skip", threads_per_worker=1)
    got = list(dl)
    assert labels(got) == [i for i in range(64) if i != 21], labels(got)
    assert [s.index for s in dl.skipped] == [21] and len(dl.deaths) == 2, dl.deaths


def raising_sample_named(policy):
    """A sample that raises among many in flight: named with its index under each policy."""
    dl = stoker.DataLoader(RaisesAt(21), batch_size=8, num_workers=2, threads_per_worker=8,
                           on_error=policy, max_retries=2)
    if policy == "skip":
        got = list(dl)
        assert labels(got) == [i for i in range(64) if i != 21], labels(got)
        assert [s.index for s in dl.skipped] == [21], dl.skipped
        return
    with expect_raises(ValueError) as raised:
        list(dl)
    e = raised.value
    assert "cannot decode sample 21" in str(e) and "21" in str(e), str(e)
    assert "dataset index 21" in str(e) or getattr(e, "index", None) == 21, str(e)


def segfault_quarantined():
    """A sample that segfaults while 7 others of its batch are in flight takes the worker down:
    the batch is re-issued one sample at a time, the culprit is named and quarantined, every
    other sample arrives exactly once."""
    dl = stoker.DataLoader(WaitsThenSegfaults(21, signal.SIGSEGV), batch_size=8, num_workers=2,
                           threads_per_worker=8, on_error="skip")
    got = list(dl)
    assert labels(got) == [i for i in range(64) if i != 21], labels(got)
    assert [s.index for s in dl.skipped] == [21], dl.skipped
    assert all(d.signal == "SIGSEGV" for d in dl.deaths), dl.deaths
    named = [d.index for d in dl.deaths if d.index is not None]
    assert named and set(named) == {21}, dl.deaths  # no innocent batch-mate is blamed
    # one death with the batch in flight, then quarantine_after (2) deaths that name it
    assert len(dl.deaths) == 3, dl.deaths


def segfault_raises():
    dl = stoker.DataLoader(WaitsThenSegfaults(21, signal.SIGSEGV), batch_size=8, num_workers=2,
                           threads_per_worker=8)
    with expect_raises(stoker.WorkerCrashed) as raised:
        list(dl)
    e = raised.value
    assert e.signal == "SIGSEGV" and e.indices == [21], (e.signal, e.indices)
    assert "dataset index 21" in str(e).splitlines()[0], str(e)
    gc.collect()
    assert not leftovers(), leftovers()


def sigkill_with_many_in_flight():
    """Workers SIGKILLed (by the dataset, as an OOM kill would) with a whole batch in flight:
    each sample still arrives exactly once, over two epochs."""
    with tempfile.TemporaryDirectory() as marks:
        dl = stoker.DataLoader(WaitsThenKillsOnce(bad=[5, 30, 47], marks=marks, n=64),
                               batch_size=8, num_workers=2, threads_per_worker=8, shuffle=True,
                               generator=torch.Generator().manual_seed(1))
        got = list(dl)
        assert labels(got) == list(range(64)), labels(got)
        # one death each, or fewer: two poison samples of one batch may both be in flight
        # when the first kill lands (the marks say each was tried), and one death covers both
        assert 1 <= len(dl.deaths) <= 3, dl.deaths
        assert sorted(os.listdir(marks)) == ["30", "47", "5"], os.listdir(marks)
        assert labels(list(dl)) == list(range(64))


def external_kill_mid_batch():
    """A worker killed from outside while 16 samples are loading at once."""
    dl = stoker.DataLoader(Waits(n=256, ms=30), batch_size=16, num_workers=2,
                           threads_per_worker=16)
    it = iter(dl)
    got = [next(it)]
    victim = it._workers[0].pid
    killer = threading.Timer(0.01, os.kill, (victim, signal.SIGKILL))
    killer.start()
    got += list(it)
    killer.join()
    assert labels(got) == list(range(256)), labels(got)
    assert [d.pid for d in dl.deaths] == [victim], dl.deaths


def hung_thread_named():
    """hang_timeout with threads: the stuck sample's stack is in the message."""
    dl = stoker.DataLoader(HangsInAThread(), batch_size=8, num_workers=2, threads_per_worker=8,
                           hang_timeout=2.0, on_worker_death="raise")
    with expect_raises(stoker.WorkerCrashed) as raised:
        list(dl)
    msg = str(raised.value)
    assert "hung for" in msg and "hang_timeout" in msg, msg
    assert "HangsInAThread" in msg or "threads_in_workers.py" in msg, msg
    gc.collect()
    assert not leftovers(), leftovers()


def resume_mid_epoch_across_threads():
    """A state_dict taken mid-epoch with 8 threads resumes exactly under 1 thread, and back."""
    def loader(threads):
        return stoker.DataLoader(Waits(ms=2), batch_size=4, num_workers=2, shuffle=True,
                                 threads_per_worker=threads,
                                 generator=torch.Generator().manual_seed(3))

    full = [b[1].tolist() for b in loader(1)]
    for before, after in ((8, 1), (1, "auto")):
        a = loader(before)
        it = iter(a)
        head = [next(it)[1].tolist() for _ in range(5)]
        state = a.state_dict()
        del it
        b = loader(after)
        b.load_state_dict(state)
        rest = [x[1].tolist() for x in b]
        assert head + rest == full, (before, after)


def stats_and_top_show_samples_in_flight():
    """stats() and stoker top say how many samples each worker loads at once."""
    from stoker.tools import top

    dl = stoker.DataLoader(Waits(n=512, ms=40), batch_size=16, num_workers=2,
                           threads_per_worker=16)
    seen_stats, seen_top = 0, 0
    for k, _ in enumerate(dl):
        seen_stats = max([seen_stats] + [w.get("in_flight") or 0
                                         for w in dl.stats()["workers"]])
        if k % 4 == 0:
            mine = [ld for ld in top.snapshot() if ld["pid"] == os.getpid()]
            seen_top = max([seen_top] + [w["in_flight"] for ld in mine for w in ld["workers"]])
    assert 1 < seen_stats <= 16 and 1 < seen_top <= 16, (seen_stats, seen_top)
    plain = stoker.DataLoader(Squares(), batch_size=8, num_workers=1)
    it = iter(plain)
    next(it)
    assert plain.stats()["workers"][0]["in_flight"] == 0  # one at a time: its index says which
    del it


def async_getitems_under_each_policy():
    """An async __getitems__ is awaited once per batch; a failing batch is searched sample by
    sample under "skip", and raises naming the sample under "raise"."""
    dl = stoker.DataLoader(AsyncBatched(), batch_size=8, num_workers=2, on_error="skip")
    assert labels(list(dl)) == [i for i in range(64) if i != 21]
    assert [s.index for s in dl.skipped] == [21], dl.skipped
    with expect_raises(ValueError, match="cannot decode sample 21"):
        list(stoker.DataLoader(AsyncBatched(), batch_size=8, num_workers=2))
