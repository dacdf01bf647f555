"""A task's samples are let go once its batch is taken: nothing of a loaded batch waits for a
full garbage collection (a reference cycle through the task's closure held every sample of
every batch loaded on threads until one came: +60 MB an epoch on 3.11, +300 MB on 3.14t)."""

from __future__ import annotations

import gc
import threading
import time
import weakref

import pytest
import torch

import stoker

pytestmark = pytest.mark.unit  # threads, no process (tests/support/tiers.py)


class Tracked(torch.utils.data.Dataset):
    def __init__(self):
        self.alive: list = []

    def __len__(self):
        return 64

    def __getitem__(self, i):
        t = torch.full((256,), i)
        self.alive.append(weakref.ref(t))
        return t


@pytest.mark.parametrize("threads", [2, "auto"])
def test_samples_loaded_on_threads_go_with_their_batch(threads):
    ds = Tracked()
    loader = stoker.DataLoader(ds, batch_size=8, num_workers=0, threads_per_worker=threads)
    was = gc.isenabled()
    gc.disable()  # only reference counts: what a cycle holds stays
    try:
        batches = 0
        for batch in loader:
            batches += 1
            del batch
        left = sum(r() is not None for r in ds.alive)
    finally:
        if was:
            gc.enable()
    assert batches == 8 and len(ds.alive) == 64
    assert left <= 8, f"{left} of 64 samples still alive after their batches were taken"


def _sample_threads(besides=()) -> list:
    return [t for t in threading.enumerate()
            if t.name.startswith("stoker-sample") and t not in besides]


def _ended(besides=(), timeout: float = 10.0) -> list:
    """The loading threads (but `besides`) still alive once each has had `timeout` to see its
    gate closed."""
    end = time.monotonic() + timeout
    for t in _sample_threads(besides):
        t.join(max(0.0, end - time.monotonic()))
    return _sample_threads(besides)


@pytest.mark.parametrize("threads", [2, "auto"])
def test_an_epochs_threads_end_with_its_iterator(threads):
    """num_workers=0 makes an iterator (a gate, its threads) each epoch: each goes with its
    iterator, by reference counts alone, after a full epoch and after a `break` (a loading
    thread that kept its last load kept the fetcher, so the gate, so itself: 2 more threads
    and their gate's batches alive each epoch, for good)."""
    gc.collect()  # (a gate an earlier test left to the collector)
    before = _sample_threads()  # (one an earlier test holds on purpose is not this one's)
    loader = stoker.DataLoader(Tracked(), batch_size=8, num_workers=0,
                               threads_per_worker=threads)
    was = gc.isenabled()
    gc.disable()
    try:
        widest = 0
        for _ in range(3):
            for _batch in loader:
                widest = max(widest, len(_sample_threads(before)))
            del _batch
            assert not _ended(before), "an epoch's loading threads outlived its iterator"
        for i, _batch in enumerate(loader):
            if i == 2:
                break
        del _batch
        assert not _ended(before), "the loading threads outlived an iterator left by a break"
    finally:
        if was:
            gc.enable()
    assert widest >= 1  # (the epochs did load on threads)
