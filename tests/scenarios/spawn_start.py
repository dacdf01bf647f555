"""Scenarios of tests/wire/test_spawn_start.py: spawn and forkserver workers that map the one sealed
memfd holding the dataset, each in a fresh process (start methods and sharing strategies are
process-wide)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal

import torch

import stoker
from scenario_datasets import Arrays, MarksShared, Reports
from scenarios.probes import private_kb


def workers_share_the_dataset(marks, method):
    """Two `method` workers map one pickle of a 192 MiB dataset instead of each holding a copy."""
    base = private_kb(os.getpid()) // 1024  # what a process with these imports holds
    ds = Arrays(mb=192, marks=marks)
    loader = stoker.DataLoader(ds, batch_size=8, num_workers=2, multiprocessing_context=method)
    epochs = 2 if method == "spawn" else 1
    for _ in range(epochs):
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
    pickled = open(marks + "/pickled").read().split()
    # Once per epoch (non-persistent workers start again with the dataset as it is now), never
    # once per worker.
    assert pickled == [str(os.getpid())] * epochs, pickled
    print("BASE GROWN", base, grown)


def restarted_and_persistent_workers_map_one_memfd(marks):
    """A killed and restarted spawn worker maps the same memfd; workers' writes stay theirs."""
    read = set()

    def memfd_inodes(pid):
        try:  # a batch may come from the worker killed after loading it
            maps = open(f"/proc/{pid}/maps").read().splitlines()
        except FileNotFoundError:
            return set()
        read.add(pid)
        return {line.split()[4] for line in maps if "stoker-dataset" in line}

    ds = Arrays(mb=16, marks=marks, write=True)
    loader = stoker.DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="spawn",
                               persistent_workers=True)
    inodes, killed, victim = set(), False, None
    for _ in range(2):
        seen = []
        for x, _writable, pid in loader:
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
    assert len(read - {victim}) >= 2, read  # the one left and the restarted one, at least
    assert len(open(marks + "/pickled").read().split()) == 1
    print("RESTARTS", stoker.stats(loader).get("restarts", ""))


def descriptors_reach_every_worker():
    """An mp.Queue, an mp.Value and a SharedList, pickled once as descriptors, serve 2 workers."""
    ctx = mp.get_context("spawn")
    ds = Reports(ctx.Queue(), ctx.Value("i", 0), stoker.SharedList(range(100)))
    loader = stoker.DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context=ctx)
    got = [int(v) for b in loader for v in b]
    assert got == list(range(16)), got
    pids = {ds.queue.get(timeout=10) for _ in range(16)}
    assert len(pids) == 2 and ds.counter.value == 16, (pids, ds.counter.value)


def shared_tensor_written_by_workers(sharing_strategy=None):
    """Spawn workers' writes to a shared tensor reach this process (under `sharing_strategy`)."""
    if sharing_strategy is not None:
        torch.multiprocessing.set_sharing_strategy(sharing_strategy)
    # under "file_system", shared by file name: one receiver a pickle, so pickled per worker
    ds = MarksShared()
    loader = stoker.DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="spawn")
    assert sorted(int(v) for b in loader for v in b) == list(range(16))
    assert ds.seen.tolist() == [1.0] * 16, ds.seen   # every worker wrote into the same memory


class _Pid(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return os.getpid()


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def forkserver_has_torch_before_the_workers():
    """The fork server that starts forkserver workers imports torch (and stoker's worker)
    once, as it starts: a worker it forks has them already (run with -m, as here, or from a
    notebook, nothing else made it import them: each worker imported torch again, ~2 s of CPU
    on 3.14, whose default start method this is). A preload list of the user's own is kept."""
    mp.set_forkserver_preload(["json"])  # (the user's own: kept, ours added)
    # (persistent: the workers still run when their parent is read)
    loader = stoker.DataLoader(_Pid(), batch_size=4, num_workers=2, persistent_workers=True,
                               multiprocessing_context="forkserver")
    pids = {int(p) for b in loader for p in b}
    servers = {_parent_of(p) for p in pids}
    assert len(pids) == 2 and len(servers) == 1 and os.getpid() not in servers, (pids, servers)
    server = servers.pop()
    maps = open(f"/proc/{server}/maps").read()
    assert "libtorch" in maps, f"the fork server {server} has not imported torch"
    from multiprocessing import forkserver

    preload = forkserver._forkserver._preload_modules
    assert preload[:2] == ["json", "torch"] and "stoker.worker.process" in preload, preload
