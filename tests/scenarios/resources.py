"""Scenarios of tests/loader/test_resources.py: the limits that break torch's transport (a small
/dev/shm, descriptors, slots), each in a fresh process."""

from __future__ import annotations

import gc
import multiprocessing
import os
import weakref

import torch

import stoker
from scenario_datasets import Big, Squares
from scenarios.probes import helpers_started, open_fds


def big_batches_through_a_small_dev_shm():
    """64 MiB batches arrive whole through a 16 MiB /dev/shm, which is left empty."""
    st = os.statvfs("/dev/shm")
    assert st.f_blocks * st.f_frsize <= 16 * 2**20, "tmpfs not mounted"
    loader = stoker.DataLoader(Big(n=4, mb=64), batch_size=1, num_workers=2)
    seen = []
    for b in loader:
        assert b.shape == (1, 16 * 2**20) and b.dtype == torch.float32
        seen.append(float(b[0, 0]))
        assert float(b[0, -1]) == seen[-1]
    assert seen == [0.0, 1.0, 2.0, 3.0], seen
    assert not os.listdir("/dev/shm"), os.listdir("/dev/shm")


def a_dropped_iterator_is_freed():
    """With the garbage collector off, an iterator dropped mid-epoch is freed at once."""
    gc.disable()
    helpers_started()  # (multiprocessing's, kept for the process: probes.helpers)
    before = open_fds()
    for kw in ({"num_workers": 2}, {"num_workers": "auto", "prefetch_factor": "auto"},
               {"num_workers": 2, "hang_timeout": 30.0, "seed": "per_sample"}):
        loader = stoker.DataLoader(Squares(n=64, shape=(16,)), batch_size=4, **kw)
        it = iter(loader)
        next(it)
        pids = [p.pid for p in it._workers]
        ref = weakref.ref(it)
        del it
        assert ref() is None, kw
        assert open_fds() == before, (kw, before, open_fds())
        for pid in pids:
            assert not os.path.exists(f"/proc/{pid}") or \
                open(f"/proc/{pid}/stat").read().split()[2] == "Z", pid


def few_fds_while_many_batches_are_held():
    """Holding 100 batches costs the main process no descriptor per batch."""
    helpers_started()
    # (the default start method starts the workers; spawn, forkserver: the dataset is sealed
    # once for them, in a memfd)
    sealed = int(multiprocessing.get_start_method() != "fork")
    before = open_fds()
    loader = stoker.DataLoader(Squares(n=400, shape=(256,)), batch_size=4, num_workers=4)
    held = []
    for i, b in enumerate(loader):
        held.append(b)
        if i == 10:
            early = open_fds()
        if i == 90:
            late = open_fds()
    assert len(held) == 100
    # per worker: its channel, its pidfd, its status page, its two log memfds and
    # multiprocessing's two pipes; per loader the epoll set, the board and (spawn, forkserver:
    # 3.14's default) the sealed dataset; never one per batch
    assert early == late and late - before <= 7 * 4 + 2 + sealed, (before, early, late, sealed)
    assert open_fds() == before, (before, open_fds())
    assert all(float(b[0][k, 0]) == 4 * i + k for i, b in enumerate(held) for k in range(4))


def slots_are_reused():
    """The slots mapped stay a small constant over 250 batches."""
    loader = stoker.DataLoader(Squares(n=2000, shape=(1024,)), batch_size=8, num_workers=2)
    it = iter(loader)
    for i, b in enumerate(it):
        del b
        if i == 20:
            slots = it.workers.mapped_slots()
    if not it.closed:
        it.workers.mapped_slots()  # still answers after the epoch
    # prefetch_factor * workers in flight, plus the batch being handed out: a small constant
    assert slots <= 2 * 2 + 4, slots
    print("SLOTS", slots)
