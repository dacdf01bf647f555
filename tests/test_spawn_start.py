"""spawn and forkserver: the dataset is pickled once into one sealed memfd that every worker maps
(engine/sealed.py), so workers start together and their memory does not grow with the dataset."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest
import torch

import stoker
from stoker.engine.sealed import Opened, Sealed


def _open(sealed: Sealed):
    return Opened(os.dup(sealed.fd), [os.dup(f) for f in sealed.extra_fds]).load()


def test_objects_come_back_equal_shared_and_copy_on_write(tmp_path):
    big = np.arange(200_000, dtype=np.float32)
    bf = torch.arange(6000, dtype=torch.bfloat16).reshape(60, 100)
    np.save(tmp_path / "m.npy", np.arange(50_000))
    objects = {
        "big": big, "again": big, "fortran": np.asfortranarray(np.ones((300, 200))),
        "strided": big[::2], "small": np.arange(3), "tensor": bf, "tensor_again": bf,
        "grad": torch.ones(4096, requires_grad=True), "param": torch.nn.Parameter(torch.ones(3)),
        "view": torch.arange(100_000)[10:20_010], "blob": b"x" * 100_000,
        "list": stoker.SharedList(range(1000)), "mm": np.load(tmp_path / "m.npy", mmap_mode="r"),
        "ints": list(range(10)),
    }
    # torch's own reduction (what a Parameter takes, as under plain spawn) moves its storage to
    # shared memory once, with a descriptor: that one stays.
    Sealed(objects).close()
    fds_before = set(os.listdir("/proc/self/fd"))
    sealed = Sealed(objects)
    try:
        a, b = _open(sealed), _open(sealed)
    finally:
        sealed.close()
    for k, v in objects.items():
        got = a[k]
        if isinstance(v, torch.Tensor):
            assert torch.equal(got, v) and got.dtype == v.dtype and got.requires_grad == v.requires_grad
        elif isinstance(v, np.ndarray):
            assert np.array_equal(got, v) and got.dtype == v.dtype
            assert got.flags.writeable == v.flags.writeable  # as it was: "r" memmaps stay so
        elif isinstance(v, stoker.SharedList):
            assert list(got) == list(v)
        else:
            assert got == v
    assert isinstance(a["param"], torch.nn.Parameter) and isinstance(a["mm"], np.memmap)
    assert a["big"] is a["again"] and a["tensor"] is a["tensor_again"]
    assert a["fortran"].flags.f_contiguous
    # The big buffers are views of the memfd's pages, not copies.
    assert a["big"].base is not None and a["tensor"].untyped_storage().nbytes() == bf.numel() * 2
    # Writes stay in the process (and the copy) that made them.
    a["big"][0] = -5
    a["tensor"][0, 0] = 7
    assert b["big"][0] == 0 and big[0] == 0 and float(b["tensor"][0, 0]) == 0.0
    del a, b  # every descriptor goes with the objects (a SharedList's, a memmap's)
    gc.collect()
    assert set(os.listdir("/proc/self/fd")) == fds_before


def test_the_memfd_is_sealed():
    import fcntl

    sealed = Sealed({"x": np.zeros(100_000)})
    try:
        seals = fcntl.fcntl(sealed.fd, fcntl.F_GET_SEALS)
        assert seals & fcntl.F_SEAL_WRITE and seals & fcntl.F_SEAL_SEAL
        with pytest.raises(OSError):
            os.pwrite(sealed.fd, b"y", 100)
    finally:
        sealed.close()


def test_an_unpicklable_dataset_raises_what_pickle_raises():
    import threading

    with pytest.raises(TypeError):
        Sealed({"lock": threading.Lock()})


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_workers_share_the_dataset_and_it_is_pickled_once(script, tmp_path, method):
    r = script(f"""
import os, time, torch, stoker
from scenario_datasets import Arrays

def private_kb(pid):
    return sum(int(l.split()[1]) for l in open(f'/proc/{{pid}}/smaps_rollup')
               if l.startswith(('Private_Dirty', 'Private_Clean')))

base = private_kb(os.getpid()) // 1024  # what a process with these imports holds
ds = Arrays(mb=192, marks={str(tmp_path)!r})
loader = stoker.DataLoader(ds, batch_size=8, num_workers=2, multiprocessing_context={method!r})
epochs = {2 if method == "spawn" else 1}
for epoch in range(epochs):
    seen, pids = [], set()
    for x, writable, pid in loader:
        seen += [int(v) for v in x[:, 0]]
        pids.update(int(p) for p in pid)
        assert bool(writable.all())
        if len(seen) == 32:
            grown = [private_kb(p) // 1024 for p in pids]
    assert seen == [int(a[0]) for a in ds.arrays], seen
    assert len(pids) == 2
    # Each worker's own memory holds no copy of the 192 MiB (torch's workers each hold one).
    assert max(grown) < base + 96, (base, grown)
pickled = open({str(tmp_path)!r} + "/pickled").read().split()
# Once per epoch (non-persistent workers start again with the dataset as it is now), never
# once per worker.
assert pickled == [str(os.getpid())] * epochs, pickled
print("OK", base, grown)
""", timeout=180)
    assert "OK" in r.stdout, r.stdout + r.stderr


def test_restarted_and_persistent_workers_map_the_same_memfd(script, tmp_path):
    r = script(f"""
import os, signal, torch, stoker
from scenario_datasets import Arrays

def memfd_inodes(pid):
    try:  # a batch may come from the worker killed after loading it
        maps = open(f'/proc/{{pid}}/maps').read().splitlines()
    except FileNotFoundError:
        return set()
    read.add(pid)
    return {{line.split()[4] for line in maps if 'stoker-dataset' in line}}

ds = Arrays(mb=16, marks={str(tmp_path)!r}, write=True)
loader = stoker.DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="spawn",
                           persistent_workers=True)
inodes, killed, read, victim = set(), False, set(), None
for epoch in range(2):
    seen = []
    for x, writable, pid in loader:
        seen += [int(v) for v in x[:, 0]]
        assert [int(v) for v in x[:, 1]] == [-1] * len(x)   # its own write, seen by itself
        for p in set(int(q) for q in pid):
            inodes |= memfd_inodes(p)
        if not killed:
            killed, victim = True, int(pid[0])
            os.kill(victim, signal.SIGKILL)
    assert seen == [int(a[0]) for a in ds.arrays], seen
# The workers' writes never reached this process.
assert all(int(a[1]) != -1 for a in ds.arrays)
assert len(inodes) == 1, inodes
assert len(read - {{victim}}) >= 2, read  # the one left and the restarted one, at least
assert len(open({str(tmp_path)!r} + "/pickled").read().split()) == 1
print("OK", stoker.stats(loader)["restarts"] if "restarts" in stoker.stats(loader) else "")
""", timeout=180)
    assert "OK" in r.stdout, r.stdout + r.stderr


def test_what_multiprocessing_passes_as_descriptors_reaches_every_worker(script):
    # An mp.Queue (a pipe and a lock), an mp.Value (an arena) and a SharedList: each pickles
    # only while a process starts, as a descriptor; one pickle must serve every worker.
    r = script("""
import multiprocessing as mp, torch, stoker
from scenario_datasets import Reports

ctx = mp.get_context("spawn")
ds = Reports(ctx.Queue(), ctx.Value("i", 0), stoker.SharedList(range(100)))
loader = stoker.DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context=ctx)
got = [int(v) for b in loader for v in b]
assert got == list(range(16)), got
pids = {ds.queue.get(timeout=10) for _ in range(16)}
assert len(pids) == 2 and ds.counter.value == 16, (pids, ds.counter.value)
print("OK")
""", timeout=120)
    assert "OK" in r.stdout, r.stdout + r.stderr


def test_no_descriptor_is_left_when_pickling_fails_midway_or_the_sealed_is_dropped(tmp_path):
    import multiprocessing as mp
    import threading

    np.save(tmp_path / "m.npy", np.arange(10_000))
    mm = np.load(tmp_path / "m.npy", mmap_mode="r")
    q = mp.get_context("spawn").Queue()
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(TypeError):  # the memmap's file and the queue's pipe were taken first
        Sealed([mm, q, threading.Lock()])
    gc.collect()
    assert set(os.listdir("/proc/self/fd")) == before
    sealed = Sealed([mm, q])
    assert len(sealed.fds()) >= 3
    del sealed
    gc.collect()
    assert set(os.listdir("/proc/self/fd")) == before


def test_a_tensor_in_shared_memory_stays_shared_and_copy_on_write_memmaps_keep_changes(
        tmp_path):
    t = torch.zeros(8).share_memory_()
    np.save(tmp_path / "c.npy", np.zeros(5000))
    c = np.load(tmp_path / "c.npy", mmap_mode="c")
    c[:] = 7  # the main process's own pages; the file still holds zeros
    sealed = Sealed({"t": t, "c": c})
    try:
        got = _open(sealed)
    finally:
        sealed.close()
    got["t"][0] = 5  # torch's reduction: the same shared memory
    assert float(t[0]) == 5.0
    assert float(got["c"][0]) == 7.0  # copied, with the main process's changes


def test_what_counts_one_receiver_a_pickle_is_pickled_per_worker():
    from stoker.engine.sealed import PerWorker

    before = torch.multiprocessing.get_sharing_strategy()
    torch.multiprocessing.set_sharing_strategy("file_system")
    try:
        with pytest.raises(PerWorker, match="file_system"):
            Sealed({"t": torch.zeros(8).share_memory_()})
    finally:
        torch.multiprocessing.set_sharing_strategy(before)


def test_a_shared_tensor_the_workers_write_reaches_the_main_process(script):
    r = script("""
import torch, stoker
from scenario_datasets import MarksShared
ds = MarksShared()
loader = stoker.DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="spawn")
assert sorted(int(v) for b in loader for v in b) == list(range(16))
assert ds.seen.tolist() == [1.0] * 16, ds.seen   # every worker wrote into the same memory
print("OK")
""", timeout=120)
    assert "OK" in r.stdout, r.stdout + r.stderr


def test_a_dataset_that_must_be_pickled_per_worker_still_starts_and_shares(script):
    r = script("""
import torch, stoker
torch.multiprocessing.set_sharing_strategy("file_system")
from scenario_datasets import MarksShared
ds = MarksShared()   # shared by file name: one receiver a pickle, so pickled per worker
loader = stoker.DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="spawn")
assert sorted(int(v) for b in loader for v in b) == list(range(16))
assert ds.seen.tolist() == [1.0] * 16, ds.seen
print("OK")
""", timeout=120)
    assert "OK" in r.stdout, r.stdout + r.stderr
