"""Limits that break torch's transport do not break stoker's."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def _can_unshare() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    r = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    return r.returncode == 0


TINY_SHM = ["unshare", "-m", "sh", "-c",
            'mount -t tmpfs -o size=16m tmpfs /dev/shm && exec "$@"', "sh"]


@pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare -m for a private /dev/shm")
def test_64mb_batches_through_a_16mb_dev_shm(script):
    r = script("""
import os, torch, stoker
from scenario_datasets import Big
st = os.statvfs('/dev/shm'); assert st.f_blocks * st.f_frsize <= 16 * 2**20, 'tmpfs not mounted'
loader = stoker.DataLoader(Big(n=4, mb=64), batch_size=1, num_workers=2)
seen = []
for b in loader:
    assert b.shape == (1, 16 * 2**20) and b.dtype == torch.float32
    seen.append(float(b[0, 0])); assert float(b[0, -1]) == seen[-1]
assert seen == [0.0, 1.0, 2.0, 3.0], seen
assert not os.listdir('/dev/shm'), os.listdir('/dev/shm')
print("OK")
""", timeout=120, wrapper=TINY_SHM)
    assert "OK" in r.stdout, r.stdout + r.stderr


def test_an_iterator_is_freed_the_moment_it_is_dropped(script):
    """No part of an iterator holds a reference back to it: dropped mid-epoch, it is freed by its
    reference count alone (the garbage collector is off), its workers end and its descriptors
    close, with autotune and the hang watch on too."""
    r = script("""
import gc, os, weakref, stoker
from scenario_datasets import Squares
gc.disable()
def fds(): return len(os.listdir('/proc/self/fd'))
before = fds()
for kw in ({"num_workers": 2}, {"num_workers": "auto", "prefetch_factor": "auto"},
           {"num_workers": 2, "hang_timeout": 30.0, "seed": "per_sample"}):
    loader = stoker.DataLoader(Squares(n=64, shape=(16,)), batch_size=4, **kw)
    it = iter(loader)
    next(it)
    pids = [p.pid for p in it._workers]
    ref = weakref.ref(it)
    del it
    assert ref() is None, kw
    assert fds() == before, (kw, before, fds())
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z", pid
print("OK")
""", timeout=120)
    assert "OK" in r.stdout, r.stdout + r.stderr


def test_main_process_holds_few_fds_while_user_holds_many_batches(script):
    r = script("""
import os, torch, stoker
from scenario_datasets import Squares
def fds(): return len(os.listdir('/proc/self/fd'))
before = fds()
loader = stoker.DataLoader(Squares(n=400, shape=(256,)), batch_size=4, num_workers=4)
held = []
for i, b in enumerate(loader):
    held.append(b)
    if i == 10: early = fds()
    if i == 90: late = fds()
assert len(held) == 100
# per worker: its channel, its pidfd, its status page, its two log memfds and
# multiprocessing's two pipes; per loader the epoll set and the board; never one per batch
assert early == late and late - before <= 7 * 4 + 2, (before, early, late)
assert fds() == before, (before, fds())
assert all(float(b[0][k, 0]) == 4 * i + k for i, b in enumerate(held) for k in range(4))
print("OK")
""", timeout=120)
    assert "OK" in r.stdout, r.stdout + r.stderr


def test_slots_are_reused_not_allocated_per_batch(script):
    r = script("""
import torch, stoker
from scenario_datasets import Squares
loader = stoker.DataLoader(Squares(n=2000, shape=(1024,)), batch_size=8, num_workers=2)
it = iter(loader)
for i, b in enumerate(it):
    del b
    if i == 20: slots = it.workers.mapped_slots()
final = it.workers.mapped_slots() if not it.closed else slots
# prefetch_factor * workers in flight, plus the batch being handed out: a small constant
assert slots <= 2 * 2 + 4, slots
print("OK", slots)
""", timeout=120)
    assert "OK" in r.stdout, r.stdout + r.stderr
