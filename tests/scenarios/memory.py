"""Scenarios of tests/loader/test_memory.py: the shared memory a user's batches pin, and
max_shared_memory's cap, each in a fresh process (they patch stoker's module globals)."""

from __future__ import annotations

import collections
import itertools
import time

import torch
from torch.utils.data import Dataset

import stoker
from scenario_datasets import Squares
from stoker import _stoker
from stoker.common import system as _system
from stoker.loader.autotune import measure, tuner
from stoker.worker import loop as _loop

K = _stoker.VIEW_SLOT_DIVISOR


def held_bytes(ts):
    """The bytes of the storages under tensors `ts`."""
    return sum(t.untyped_storage().nbytes() for t in ts)


def check_bound(loader, held, what):
    """Asserts that the slot bytes the user pins are at most K times the bytes of `held`."""
    mem = loader.stats()["memory"]
    pinned, h = mem["bytes_held_by_user"], held_bytes(held)
    print(what, "pinned", pinned, "held", h, "slots", mem["slots_held_by_user"])
    assert pinned <= K * h, (what, pinned, h, mem)
    return mem


class Images(Squares):
    """32 x 3x64x64 uint8 images (384 KiB, views) and 32 int labels (256 B, copies) a batch."""

    def __getitem__(self, i):
        return torch.full((3, 64, 64), i % 251, dtype=torch.uint8), i


class TwoSizes(Dataset):
    """Per batch of 8: 'big' 1 MiB, 'medium' 128 KiB (< slot / K)."""

    def __len__(self):
        return 8 * 200

    def __getitem__(self, i):
        return {"big": torch.full((32 * 1024,), float(i)), "medium": torch.full((2048,), -i)}


def keeping_only_labels():
    """Labels kept from 200 batches pin no slot, and keep their values as slots are reused."""
    loader = stoker.DataLoader(Images(n=32 * 400), batch_size=32, num_workers=2)
    it = iter(loader)
    labels = []
    for _ in range(200):
        images, label = next(it)
        assert images.untyped_storage().nbytes() >= _stoker.VIEW_MIN_BYTES
        labels.append(label)
        del images, label
    check_bound(loader, labels, "labels only")
    for _ in range(50):  # later batches reuse the slots: the labels kept their values
        next(it)
    assert all(int(lb[k]) == 32 * i + k for i, lb in enumerate(labels) for k in range(32))


def holding_1000_tiny_batches():
    """1000 tiny batches held (copies) pin no slot and keep their values."""
    loader = stoker.DataLoader(Squares(n=4 * 1200, shape=(4,)), batch_size=4, num_workers=2)
    it = iter(loader)
    held = [next(it) for _ in range(1000)]
    mem = check_bound(loader, [t for b in held for t in b], "1000 tiny batches")
    assert mem["slots_held_by_user"] == 0, mem
    for _ in range(100):
        next(it)
    assert all(float(b[0][k, 0]) == 4 * i + k and int(b[1][k]) == 4 * i + k
               for i, b in enumerate(held) for k in range(4))


def large_views_and_medium_copies():
    """Big fields stay views of their slot (one slot each); medium ones are copies."""
    loader = stoker.DataLoader(TwoSizes(), batch_size=8, num_workers=2)
    it = iter(loader)
    mediums = [next(it)["medium"] for _ in range(60)]
    check_bound(loader, mediums, "medium fields only")
    bigs = [next(it)["big"] for _ in range(10)]
    mem = check_bound(loader, mediums + bigs, "and 10 big fields")
    assert mem["slots_held_by_user"] == 10, mem  # each big field is a view of its batch's slot
    assert all(int(m[k, 0]) == -(8 * i + k) for i, m in enumerate(mediums) for k in range(8))
    assert all(float(b[k, 0]) == 8 * (60 + i) + k for i, b in enumerate(bigs) for k in range(8))


# 1 MiB batches; 8 MiB split between 2 workers leaves each room for 3 slots.
CAP = 8 << 20


def _capped(patience):
    """A forked loader of 1 MiB batches under an 8 MiB cap, its workers patient `patience` s."""
    _loop.SHARED_MEMORY_PATIENCE_S = patience
    loader = stoker.DataLoader(Squares(n=4 * 60, shape=(64 * 1024,)), batch_size=4,
                               num_workers=2, max_shared_memory=CAP,
                               multiprocessing_context="fork")
    return loader, iter(loader)


def holding_beyond_the_cap(patience):
    """Holding every batch hits the cap with SharedMemoryLimitError; prints HELD and MESSAGE."""
    loader, it = _capped(patience)
    held = []
    try:
        for b in it:
            held.append(b)
            assert loader.stats()["memory"]["bytes_mapped"] <= CAP
    except stoker.SharedMemoryLimitError as e:
        assert isinstance(e, MemoryError)
        print("HELD", len(held))
        print("MESSAGE", e)
    else:
        raise AssertionError("holding every batch never hit the cap")


def workers_wait_for_the_user(patience):
    """Workers wait while every slot is held and go on, in order, once the batches are dropped."""
    loader, it = _capped(patience)
    held = [next(it) for _ in range(6)]  # every slot of both workers is now held
    time.sleep(2.0)  # the workers wait for room (not an error: patience is 60 s)
    assert loader.stats()["memory"]["bytes_mapped"] <= CAP
    first = [float(b[0][k, 0]) for b in held for k in range(4)]
    held.clear()
    rest = []
    for b in it:
        rest.append(float(b[0][0, 0]))
        assert loader.stats()["memory"]["bytes_mapped"] <= CAP
        del b
    assert first == [float(i) for i in range(24)], first
    assert rest == [float(4 * i) for i in range(6, 60)], rest


def auto_workers_divide_the_cap_among_those_running():
    """num_workers="auto" keeps the last two 4 MiB batches under a 24 MiB cap to the end."""
    _system.usable_cpus = lambda: 2
    _loop.SHARED_MEMORY_PATIENCE_S = 5.0
    cap = 24 << 20
    loader = stoker.DataLoader(Squares(n=60, shape=(1 << 20,)), batch_size=1,
                               num_workers="auto", max_shared_memory=cap)
    last, peak, seen = collections.deque(maxlen=2), 0, []
    for b in loader:
        last.append(b)
        seen.append(int(b[1][0]))
        peak = max(peak, loader.stats()["memory"]["bytes_mapped"])
    assert seen == list(range(60)), seen
    assert peak <= cap, peak
    print("PEAK MiB", peak >> 20)


def a_worker_added_takes_its_share():
    """A scripted tuner adds a worker: every batch arrives and the slots stay under the cap."""
    _system.usable_cpus = lambda: 2
    measure.WINDOW_S = 0.0
    steps = itertools.chain([1] * 10, itertools.repeat(2))

    def decide(self, window, batch):
        self.active = next(steps)
        return self.active

    tuner.Tuner.decide = decide
    cap = 48 << 20
    loader = stoker.DataLoader(Squares(n=80, shape=(1 << 20,)), batch_size=1,
                               num_workers="auto", max_shared_memory=cap)
    seen, peak = [], 0
    for b in loader:
        seen.append(int(b[1][0]))
        peak = max(peak, loader.stats()["memory"]["bytes_mapped"])
        del b
    assert seen == list(range(80)), seen
    assert peak <= cap, peak
    assert loader.stats()["autotune"]["active_workers"] == 2
