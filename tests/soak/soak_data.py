"""The soak's dataset and sampler (tests/soak/chaos.py). A module of their own, importable by
spawned workers and the node pool's workers."""

from __future__ import annotations

import ctypes
import random
import time

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

FEATURES = 48


def flaky(i: int, every: int) -> bool:
    """Whether sample `i` fails its first attempt in a process: one in `every`."""
    return every > 0 and (i * 2654435761) % every == 0


class Chaos(Dataset):
    """Sample i: its index, a float tensor filled with i, and a small NumPy array,
    so every value can be checked where it arrives. `flaky_every`: one sample in that many
    raises at its first attempt in a process (on_error="retry" loads it again; "skip" drops
    it). `poison`: indices whose loading segfaults, every time. `load_s`: seconds a sample
    takes (a sleep: a kill lands while loading as often as between samples)."""

    def __init__(self, n: int, flaky_every: int = 0, poison=(), load_s: float = 0.001):
        self.n, self.flaky_every, self.poison, self.load_s = n, flaky_every, set(poison), load_s
        self._tried: set = set()  # in this process

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        i = int(i)
        if i in self.poison:
            ctypes.string_at(0)  # a decoder's segmentation fault
        if flaky(i, self.flaky_every) and i not in self._tried:
            self._tried.add(i)
            raise OSError(f"transient read error on sample {i}")
        if self.load_s:
            time.sleep(self.load_s)
        return {"index": i, "x": torch.full((FEATURES,), float(i)),
                "a": np.arange(4, dtype=np.int64) + i}


def check_batch(b) -> list[int]:
    """The indices of batch `b`, after checking every value against them; raises ValueError
    naming what is wrong."""
    idx = b["index"].tolist()
    want = torch.tensor(idx, dtype=torch.float32)[:, None]
    if b["x"].shape != (len(idx), FEATURES) or not torch.equal(b["x"], want.expand(-1, FEATURES)):
        raise ValueError(f"corrupt x for indices {idx}")
    a = b["a"]
    if not torch.equal(a, torch.tensor(idx)[:, None] + torch.arange(4)):
        raise ValueError(f"corrupt a for indices {idx}")
    return idx


class Recorded(Sampler):
    """A new random order every epoch, remembered: what the loader must deliver, in order."""

    def __init__(self, n: int, seed: int):
        self.n, self.rng, self.orders = n, random.Random(seed), []

    def __len__(self):
        return self.n

    def __iter__(self):
        order = list(range(self.n))
        self.rng.shuffle(order)
        self.orders.append(order)
        return iter(order)

