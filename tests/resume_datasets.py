"""Datasets for the checkpoint and resume tests (module level: spawn pickles them)."""

from __future__ import annotations

import random

import numpy as np
import torch
from torch.utils.data import Dataset


class Augmented(Dataset):
    """Each sample draws from random, NumPy and torch, as augmentation does: its values are
    reproducible only when its generators are seeded per sample."""

    def __init__(self, n=40):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"index": i, "torch": torch.rand(2), "numpy": np.random.rand(), "py": random.random()}


def as_lists(batches):
    """Batches of Augmented as plain comparable lists (exact float values kept)."""
    return [[b["index"].tolist(), b["torch"].tolist(), b["numpy"].tolist(), b["py"].tolist()]
            for b in batches]


def indices(batches):
    return [b["index"].tolist() for b in batches]


class FailsAt(Dataset):
    """Sample i is i, except those in `bad`, which raise (a corrupt file)."""

    def __init__(self, bad, n=64):
        self.bad = set(bad)
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i in self.bad:
            raise ValueError(f"cannot decode sample {i}: corrupt file")
        return i


class Stream(torch.utils.data.IterableDataset):
    """0..n-1, split among workers by stride (each worker iterates its own copy)."""

    def __init__(self, n=30):
        self.n = n

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        k, w = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(k, self.n, w))
