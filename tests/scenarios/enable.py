"""Scenarios of tests/loader/integrations/test_enable.py, and what the processes they start import by name: the
datasets (``Squares``, ``LocksInWorkers``) and the spawned child's ``child_served``.
``train_unchanged.py`` beside it is the unchanged program ``stoker run`` serves."""

from __future__ import annotations

import json
import multiprocessing as mp
import os

import torch
from torch.utils.data import DataLoader

import stoker
from scenario_datasets import Slow
from stoker.loader.integrations import enable as _enable
from stoker.tools import top


class Squares(torch.utils.data.Dataset):
    """i * i for i in 0..7; sample 3 raises ValueError."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 3:
            raise ValueError("sample 3 is bad")
        return torch.tensor([i * i])


class LocksInWorkers(torch.utils.data.Dataset):
    """Each worker creates a multiprocessing lock (as a tqdm bar does): a semaphore the resource
    tracker watches until the worker's exit cleanup unregisters it."""

    locks: list = []

    def __len__(self):
        return 64

    def __getitem__(self, i):
        if not self.locks:
            import multiprocessing

            self.locks.append(multiprocessing.get_context("spawn").Lock())
        return torch.tensor([i])


def child_served(q):
    """In a spawned child: (samples, served_by) of a torch loader, or None where stoker is off."""
    if not _enable.is_enabled():
        q.put(None)
        return
    dl = DataLoader(Squares(), batch_size=2, num_workers=1)
    q.put((sum(len(b) for b in dl), stoker.stats(dl)["served_by"]))


class ShardLoader(DataLoader):
    """A framework's subclass of torch's DataLoader (module-level: stoker top shows its
    __qualname__)."""


def top_names_the_server():
    """stoker top names an enabled framework subclass's server; prints SERVER and the render."""
    stoker.enable()
    it = iter(ShardLoader(Slow(1000), batch_size=2, num_workers=1))
    next(it)
    mine = [ld for ld in top.snapshot() if ld["pid"] == os.getpid()]
    print("SERVER", json.dumps([ld["served_by"] for ld in mine]))
    print(top.render(mine, {}, 0.0))


def _ask(ctx):
    q = ctx.Queue()
    p = ctx.Process(target=child_served, args=(q,))
    p.start()
    out = q.get(timeout=120)
    p.join()
    return out


def enable_reaches_spawned_children():
    """A spawned child is served after stoker.enable() and not after stoker.disable()."""
    stoker.enable(on_error="skip")  # here only: the spawned child does not run this line
    ctx = mp.get_context("spawn")
    print("CHILD", _ask(ctx))
    stoker.disable()
    print("AFTER", _ask(ctx))


KEPT = []  # what the exit scenario leaves alive until the interpreter exits


def exit_with_a_live_spawn_iterator(persistent):
    """Exits with a spawn iterator and its workers alive (kept in KEPT); prints EXITING."""
    dl = stoker.DataLoader(LocksInWorkers(), batch_size=2, num_workers=2,
                           multiprocessing_context="spawn", persistent_workers=persistent)
    it = iter(dl)
    next(it)
    next(it)
    KEPT.append((dl, it))
    print("EXITING", flush=True)  # with the iterator and its workers alive
