"""timm's create_loader (timm 1.0) under stoker.enable(): it returns a torch DataLoader, which
iterates on stoker's engine with timm's transforms and worker seeding; the batches equal
torch's. Runs in the vision venv (`make test-vision`): timm imports torchvision."""

from __future__ import annotations

import os

import numpy as np
import torch
from PIL import Image
from timm.data import ImageDataset, create_loader

import stoker


def _images(root, n=24):
    for c in ("cat", "dog"):
        os.makedirs(os.path.join(root, c), exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        img = Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8))
        img.save(os.path.join(root, "cat" if i % 2 else "dog", f"{i}.png"))


def _epoch(root):
    loader = create_loader(ImageDataset(root), input_size=(3, 32, 32), batch_size=8,
                           is_training=False, num_workers=2, use_prefetcher=False,
                           persistent_workers=False, device=torch.device("cpu"))
    batches = [(x.clone(), y.clone()) for x, y in loader]
    return loader, batches


def test_create_loader_is_served_and_gives_torchs_batches(tmp_path):
    root = str(tmp_path / "images")
    _images(root)
    _, want = _epoch(root)
    stoker.enable()
    try:
        loader, got = _epoch(root)
        assert stoker.stats(loader)["served_by"] == "stoker.enable()"
    finally:
        stoker.disable()
    assert len(got) == len(want) == 3
    for (x, y), (wx, wy) in zip(got, want):
        assert x.shape == (8, 3, 32, 32) and torch.equal(x, wx) and torch.equal(y, wy)
