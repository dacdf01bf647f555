"""A small procedurally drawn JPEG dataset and a map-style ``Dataset`` that reads it.

``generate(root, images)`` writes ``images`` deterministic 160x160 RGB JPEGs (a noisy, muted
colour gradient with one of ten shapes drawn on it; the label is the shape class, and each class
also has its own jittered hue so a tiny CNN learns it in a few epochs) plus an ``index.txt``
listing ``<file> <label>`` per line, and writes the ``COMPLETE`` marker last so an interrupted run
is regenerated rather than reused.

``JpegFolder(root, crop=128, train=True)`` is an ordinary ``torch.utils.data.Dataset``: every
``__getitem__`` opens and decodes a JPEG with Pillow, random-crops it and randomly flips it with
torch's RNG (so per-worker seeding matters), and returns ``(uint8 tensor CxHxW, int label)``. It is
a module-level class holding only paths and ints, so it pickles cleanly for spawned workers.
"""

from __future__ import annotations

import colorsys
import json
import math
import os
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw
from torch.utils.data import Dataset

IMAGE_SIZE = 160
NUM_CLASSES = 10
CLASS_NAMES = (
    "circle",
    "square",
    "triangle",
    "pentagon",
    "hexagon",
    "star",
    "cross",
    "ring",
    "ellipse",
    "chevron",
)
INDEX_FILE = "index.txt"
MARKER_FILE = "COMPLETE"
FORMAT_VERSION = 2


# --------------------------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------------------------


def _marker(images: int) -> dict:
    return {"version": FORMAT_VERSION, "images": images, "size": IMAGE_SIZE}


def is_complete(root: str | os.PathLike, images: int) -> bool:
    """True when ``root`` holds a finished dataset of exactly ``images`` images."""
    try:
        with open(Path(root) / MARKER_FILE) as f:
            return json.load(f) == _marker(images)
    except (OSError, ValueError):
        return False


def _regular_polygon(sides: int, cx: float, cy: float, r: float, angle: float) -> list:
    t = angle + np.arange(sides) * (2 * math.pi / sides)
    return list(zip((cx + r * np.cos(t)).tolist(), (cy + r * np.sin(t)).tolist()))


def _rotated(points: np.ndarray, cx: float, cy: float, scale: float, angle: float) -> list:
    c, s = math.cos(angle), math.sin(angle)
    rot = np.array([[c, -s], [s, c]])
    pts = points @ rot.T * scale + (cx, cy)
    return [tuple(p) for p in pts.tolist()]


_STAR_ANGLES = np.arange(10) * (math.pi / 5)
_STAR = (
    np.stack([np.cos(_STAR_ANGLES), np.sin(_STAR_ANGLES)], axis=1)
    * np.where(np.arange(10) % 2 == 0, 1.0, 0.45)[:, None]
)
_CROSS = np.array(
    [(-0.3, -1), (0.3, -1), (0.3, -0.3), (1, -0.3), (1, 0.3), (0.3, 0.3), (0.3, 1), (-0.3, 1),
     (-0.3, 0.3), (-1, 0.3), (-1, -0.3), (-0.3, -0.3)]
)  # fmt: skip
_CHEVRON = np.array([(-1, -0.8), (0, 0.2), (1, -0.8), (1, -0.1), (0, 0.9), (-1, -0.1)])
_ELLIPSE_ANGLES = np.linspace(0, 2 * math.pi, 48, endpoint=False)
_ELLIPSE = np.stack([np.cos(_ELLIPSE_ANGLES), 0.45 * np.sin(_ELLIPSE_ANGLES)], axis=1)


def _draw_image(index: int, seed: int, grid: tuple) -> tuple[Image.Image, int]:
    """Draw image ``index``: deterministic in (seed, index) alone."""
    rng = np.random.default_rng((seed, index))
    label = int(rng.integers(NUM_CLASSES))

    # Background: a linear gradient between two muted colours at a random angle, plus noise.
    xs, ys = grid
    a = rng.uniform(0, 2 * math.pi)
    t = (math.cos(a) * xs + math.sin(a) * ys + 1.0) * 0.5
    c0, c1 = rng.uniform(20, 235, size=(2, 1)) + rng.uniform(-25, 25, size=(2, 3))
    bg = c0 + t[..., None] * (c1 - c0) + rng.normal(0, 6, size=(IMAGE_SIZE, IMAGE_SIZE, 3))
    img = Image.fromarray(np.clip(bg, 0, 255).astype(np.uint8))

    # Foreground: one shape of class ``label`` at a random place, size and rotation, in a
    # saturated colour whose hue depends on the class (with jitter).
    draw = ImageDraw.Draw(img)
    r = rng.uniform(22, 48)
    cx, cy = rng.uniform(r + 4, IMAGE_SIZE - r - 4, size=2)
    angle = rng.uniform(0, 2 * math.pi)
    hue = (label / NUM_CLASSES + rng.uniform(-0.08, 0.08)) % 1.0
    rgb = colorsys.hsv_to_rgb(hue, rng.uniform(0.7, 1.0), rng.uniform(0.6, 1.0))
    fill = tuple(int(v * 255) for v in rgb)
    box = (cx - r, cy - r, cx + r, cy + r)
    if label == 0:
        draw.ellipse(box, fill=fill)
    elif label in (1, 2, 3, 4):
        sides = {1: 4, 2: 3, 3: 5, 4: 6}[label]
        draw.polygon(_regular_polygon(sides, cx, cy, r, angle), fill=fill)
    elif label == 5:
        draw.polygon(_rotated(_STAR, cx, cy, r, angle), fill=fill)
    elif label == 6:
        draw.polygon(_rotated(_CROSS, cx, cy, r, angle), fill=fill)
    elif label == 7:
        draw.ellipse(box, outline=fill, width=max(3, int(r * 0.3)))
    elif label == 8:
        draw.polygon(_rotated(_ELLIPSE, cx, cy, r, angle), fill=fill)
    else:
        draw.polygon(_rotated(_CHEVRON, cx, cy, r, angle), fill=fill)
    return img, label


def generate(root: str | os.PathLike, images: int, seed: int = 0, progress=None) -> None:
    """Write ``images`` JPEGs, ``index.txt`` and, last, the ``COMPLETE`` marker into ``root``.

    Files are overwritten in place (never deleted), so pointing ``root`` at an existing folder
    is safe. ``progress``, if given, is called with the number of images written so far.
    """
    root = Path(root)
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / MARKER_FILE).unlink(missing_ok=True)

    coords = np.linspace(-1.0, 1.0, IMAGE_SIZE)
    grid = np.meshgrid(coords, coords)
    lines = []
    for i in range(images):
        img, label = _draw_image(i, seed, grid)
        name = f"images/{i:06d}.jpg"
        img.save(root / name, quality=90)
        lines.append(f"{name} {label}\n")
        if progress is not None:
            progress(i + 1)

    with open(root / INDEX_FILE, "w") as f:
        f.writelines(lines)
    with open(root / MARKER_FILE, "w") as f:
        json.dump(_marker(images), f)


# --------------------------------------------------------------------------------------------
# Dataset
# --------------------------------------------------------------------------------------------


class JpegFolder(Dataset):
    """Map-style dataset over a folder written by :func:`generate`.

    Each item is decoded from disk on every access (no caching), cropped to ``crop`` x ``crop``
    (random crop and random horizontal flip when ``train``, centre crop otherwise) and returned as
    ``(uint8 tensor of shape 3 x crop x crop, int label)``.
    """

    def __init__(self, root: str | os.PathLike, crop: int = 128, train: bool = True):
        self.root = str(root)
        self.crop = crop
        self.train = train
        with open(os.path.join(self.root, INDEX_FILE)) as f:
            entries = [line.split() for line in f if line.strip()]
        self.files = [name for name, _ in entries]
        self.labels = [int(label) for _, label in entries]

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        with Image.open(os.path.join(self.root, self.files[index])) as im:
            img = im.convert("RGB")
        w, h = img.size
        c = self.crop
        if self.train:
            # torch's RNG, so the result depends on the loader's per-worker seeding.
            left = int(torch.randint(0, w - c + 1, ()).item())
            top = int(torch.randint(0, h - c + 1, ()).item())
            flip = bool(torch.rand(()).item() < 0.5)
        else:
            left, top, flip = (w - c) // 2, (h - c) // 2, False
        img = img.crop((left, top, left + c, top + c))
        if flip:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        hwc = np.asarray(img, dtype=np.uint8)
        return torch.from_numpy(np.ascontiguousarray(hwc.transpose(2, 0, 1))), self.labels[index]


class CrashesOn(Dataset):
    """`dataset` with one corrupt file: loading index `bad` crashes the process with a
    segmentation fault, as a C decoder fed a corrupt JPEG does. Every other sample is
    `dataset`'s."""

    def __init__(self, dataset: Dataset, bad: int):
        self.dataset, self.bad = dataset, bad

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        if i == self.bad:
            import ctypes

            ctypes.string_at(0)  # the decoder reads through a null pointer
        return self.dataset[i]
