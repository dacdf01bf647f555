"""spawn and forkserver: the dataset is pickled once into one sealed memfd that every worker maps
(wire/sealed.py), so workers start together and their memory does not grow with the dataset."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest
import torch

import stoker
from stoker.wire.sealed import Opened, Sealed
from support.scenarios import run_ok


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
    gc.collect()  # (garbage of earlier tests whose descriptors the collection below would close)
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


@pytest.mark.unit
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


@pytest.mark.unit
def test_an_unpicklable_dataset_raises_what_pickle_raises():
    import threading

    with pytest.raises(TypeError):
        Sealed({"lock": threading.Lock()})


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_workers_share_the_dataset_and_it_is_pickled_once(tmp_path, method):
    run_ok("spawn_start.workers_share_the_dataset", str(tmp_path), method,
           timeout=180)


def test_restarted_and_persistent_workers_map_the_same_memfd(tmp_path):
    run_ok("spawn_start.restarted_and_persistent_workers_map_one_memfd",
           str(tmp_path), timeout=180)


def test_the_forkserver_imports_torch_once_for_every_worker():
    run_ok("spawn_start.forkserver_has_torch_before_the_workers", timeout=120)


def test_what_multiprocessing_passes_as_descriptors_reaches_every_worker():
    # An mp.Queue (a pipe and a lock), an mp.Value (an arena) and a SharedList: each pickles
    # only while a process starts, as a descriptor; one pickle must serve every worker.
    run_ok("spawn_start.descriptors_reach_every_worker", timeout=120)


def test_no_descriptor_is_left_when_pickling_fails_midway_or_the_sealed_is_dropped(tmp_path):
    import multiprocessing as mp
    import threading

    np.save(tmp_path / "m.npy", np.arange(10_000))
    mm = np.load(tmp_path / "m.npy", mmap_mode="r")
    q = mp.get_context("spawn").Queue()
    gc.collect()  # (garbage of earlier tests whose descriptors the collection below would close)
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


@pytest.mark.unit
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


@pytest.mark.unit
def test_what_counts_one_receiver_a_pickle_is_pickled_per_worker():
    from stoker.wire.sealed import PerWorker

    before = torch.multiprocessing.get_sharing_strategy()
    torch.multiprocessing.set_sharing_strategy("file_system")
    try:
        with pytest.raises(PerWorker, match="file_system"):
            Sealed({"t": torch.zeros(8).share_memory_()})
    finally:
        torch.multiprocessing.set_sharing_strategy(before)


def test_a_shared_tensor_the_workers_write_reaches_the_main_process():
    run_ok("spawn_start.shared_tensor_written_by_workers", timeout=120)


def test_a_dataset_that_must_be_pickled_per_worker_still_starts_and_shares():
    run_ok("spawn_start.shared_tensor_written_by_workers", "file_system",
           timeout=120)
