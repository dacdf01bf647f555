"""The Ray placement's room policy on its own (placements/ray/room.py): each worker's batches
bounded by its share, the patience counted afresh from each batch that comes free, and the
error's words. No cluster: buffers are NumPy arrays, as the object store's are."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import stoker
from stoker.loader.iterators.failure import WorkerFailure
from stoker.placements.ray.room import Room

pytestmark = pytest.mark.unit  # no process (tests/support/tiers.py)


def test_a_workers_batches_are_bounded_by_its_own_share():
    room = Room(patience_s=5.0)
    room.set_share(0, 8 << 20)
    room.set_share(1, None)  # no cap
    a, b = np.zeros(4 << 20, np.uint8), np.zeros(4 << 20, np.uint8)
    room.hold(0, a)
    assert room.fits(0)
    room.hold(0, b)
    assert not room.fits(0) and room.fits(1)  # another worker's share is its own
    usage = room.usage()
    assert usage["slots_held_by_user"] == 2 and usage["bytes_held_by_user"] == 8 << 20
    del a
    gc.collect()
    assert room.fits(0) and room.usage()["slots_held_by_user"] == 1


def test_the_patience_starts_afresh_when_a_batch_comes_free():
    room = Room(patience_s=5.0)
    room.set_share(0, 1)
    buf = np.zeros(16, np.uint8)
    room.hold(0, buf)
    assert not room.expired(0, since=100.0, now=104.0)
    assert room.expired(0, since=100.0, now=106.0)
    del buf  # freed now: a task held back since long ago waits its patience from here
    gc.collect()
    import time

    now = time.monotonic()
    assert not room.expired(0, since=0.0, now=now + 4.0)
    assert room.expired(0, since=0.0, now=now + 6.0)


def test_the_error_says_the_share_and_what_is_held():
    room = Room(patience_s=3.0)
    room.set_share(1, 8 << 20)
    kept = [np.zeros(4 << 20, np.uint8) for _ in range(2)]
    for k in kept:
        room.hold(1, k)
    report = room.limit_report(1)
    assert report["type"] is stoker.SharedMemoryLimitError and report["worker_id"] == 1
    try:
        WorkerFailure(report).reraise(room.usage)
    except stoker.SharedMemoryLimitError as e:
        msg = str(e)
    assert "worker 1 (a Ray actor) waited 3 s" in msg, msg
    assert "share of max_shared_memory is 8.0 MiB" in msg and "2 batch(es)" in msg, msg
    assert "In all, your code holds 2 batch(es) whose tensors keep 8.0 MiB" in msg, msg
