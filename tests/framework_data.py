"""Datasets for the framework integration tests: each sample says whether a stoker worker loaded
it (``engine``: stoker's get_worker_info is set only in stoker's workers, never in torch's), and
one sample is bad, so a run that finishes proves ``on_error="skip"`` reached the loader."""

from __future__ import annotations

import json
import os

import torch

import stoker

BAD = 5


class Probe(torch.utils.data.Dataset):
    def __init__(self, n=16):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == BAD:
            raise ValueError(f"sample {i} is corrupt (a test's bad sample)")
        return {"x": torch.full((4,), float(i)), "y": torch.tensor(float(i % 2)),
                "idx": torch.tensor(i), "engine": torch.tensor(int(stoker.get_worker_info()
                                                                 is not None))}


def report(path, rank, seen_idx, engine_flags, extra=None):
    with open(f"{path}.{rank}", "w") as f:
        json.dump({"idx": sorted(seen_idx), "engine": sorted(set(engine_flags)),
                   "pid": os.getpid(), **(extra or {})}, f)
