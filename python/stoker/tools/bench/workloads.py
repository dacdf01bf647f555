"""The benchmark workloads: real dataset classes, each a common shape of training input."""

from __future__ import annotations

import io
import random
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch.utils.data import Dataset


class ImageTensors(Dataset):
    """A fresh uint8 3x224x224 tensor per sample and an int label (decoded images)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.full((3, 224, 224), i % 251, dtype=torch.uint8), i


class ManyFields(Dataset):
    """A dict of 16 small float tensors, 4 ints and 2 strings per sample (detection / tabular)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        d = {f"f{k}": torch.full((8,), float(i + k)) for k in range(16)}
        d.update({f"i{k}": i * 4 + k for k in range(4)})
        d["name"] = f"sample-{i}"
        d["source"] = "shard-" + str(i % 7)
        return d


class JpegDecode(Dataset):
    """JPEG bytes in memory, decoded with Pillow, random crop 192 and horizontal flip."""

    def __init__(self, n, distinct=64, size=256):
        from PIL import Image

        rng = np.random.default_rng(0)
        self.blobs = []
        for k in range(distinct):
            img = (rng.random((size, size, 3)) * 64 + k * 3).astype(np.uint8)
            img[::8] = 255 - img[::8]
            buf = io.BytesIO()
            Image.fromarray(img).save(buf, format="JPEG", quality=90)
            self.blobs.append(buf.getvalue())
        self.n = n
        self.size = size

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        from PIL import Image

        img = Image.open(io.BytesIO(self.blobs[i % len(self.blobs)])).convert("RGB")
        x = random.randint(0, self.size - 192)
        y = random.randint(0, self.size - 192)
        img = img.crop((x, y, x + 192, y + 192))
        if random.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1), i % 10


class Tokens(Dataset):
    """Variable-length int64 token sequences (16 to 512 tokens)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        length = 16 + (i * 7919) % 497
        return torch.arange(length, dtype=torch.int64) + i


def pad_tokens(batch):
    seqs = [b for b in batch]
    lengths = torch.tensor([len(s) for s in seqs])
    padded = torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True, padding_value=0)
    return {"tokens": padded, "lengths": lengths}


class Metadata(Dataset):
    """Holds 1,000,000 Python dicts (path, label, size); each sample scans a strided slice of
    them, so every worker reads every item, as a sampler or a lookup table would."""

    def __init__(self, n, items=1_000_000, shared=False):
        records = ({"path": f"/data/train/{k:07d}.jpg", "label": k % 1000, "size": 1000 + k % 977}
                   for k in range(items))
        if shared:
            from stoker import SharedList

            self.items = SharedList(records)
        else:
            self.items = list(records)
        self.n = n
        self.stride = 64

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        total = 0
        items = self.items
        for k in range(i % self.stride, len(items), self.stride):
            total += items[k]["size"]
        return torch.tensor([total, i])


class Compute(Dataset):
    """Pure-Python work of a few ms a sample (3-5 ms on a 2-core machine here) (integer arithmetic in a loop, no
    C library that releases the GIL): what a dataset that computes in Python costs, and what
    threads can only speed up on a free-threaded interpreter."""

    STEPS = 40_000

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        h = i
        for k in range(self.STEPS):
            h = (h * 31 + k) & 0xFFFF_FFFF
        return torch.tensor([h, i])


@dataclass
class Workload:
    name: str
    make: Callable  # (loader_name) -> dataset
    batch_size: int
    samples: int  # per run
    collate_fn: Callable | None = None
    workers: int | None = None  # fixed worker count (metadata)
    measure_memory: bool = False
    # the forms its dataset takes (make's argument): a bound is measured for each, the quickest
    # counts (metadata: a list of dicts for torch and the peers, a SharedList for stoker)
    forms: tuple = ("torch",)
    in_default: bool = True  # run by a plain `stoker bench` (compute: only by --threads)


WORKLOADS = {
    "image": Workload("image", lambda who: ImageTensors(64 * 80), 64, 64 * 80),
    "fields": Workload("fields", lambda who: ManyFields(64 * 200), 64, 64 * 200),
    "decode": Workload("decode", lambda who: JpegDecode(32 * 120), 32, 32 * 120),
    "compute": Workload("compute", lambda who: Compute(32 * 40), 32, 32 * 40,
                        in_default=False),
    "tokens": Workload("tokens", lambda who: Tokens(64 * 150), 64, 64 * 150, pad_tokens),
    # Small batches and enough of them that the timed window (after the first batch) is many
    # times the batches 4 workers have in flight when it opens: with 4 batches of 64 it timed
    # work done before it opened, at 5-38x the work's own bound.
    "metadata": Workload(
        "metadata", lambda who: Metadata(512, shared=(who == "stoker")), 8, 512,
        workers=4, measure_memory=True, forms=("torch", "stoker"),
    ),
}
# the workloads a plain `stoker bench` runs
DEFAULT = tuple(name for name, w in WORKLOADS.items() if w.in_default)
