"""stoker demo: the same small training loop fed by ``stoker.DataLoader`` and by torch's.

What it shows:

* ``stoker.DataLoader`` is a drop-in replacement for ``torch.utils.data.DataLoader``: both are
  built with exactly the same arguments (an ordinary map-style ``Dataset``, ``batch_size``,
  ``shuffle`` with a seeded ``generator``, ``num_workers``) and the loop body is identical.
* The workload is data-loading heavy: every sample is a JPEG decoded with Pillow, randomly
  cropped and flipped (torch RNG, so per-worker seeding matters), and collated into uint8
  batches, while the main process runs one SGD step of a tiny CNN per batch.
* At the end it prints the throughput (images/s) of both loaders side by side, their ratio, and
  the mean loss of the first and last epoch of each run, to show both actually trained. Both runs
  start from the same weights and the same seeded ``generator``, so a loader that reproduces
  torch's sampling order and per-worker seeding ends with exactly the same loss.

On first use it generates a small deterministic JPEG dataset (procedurally drawn shapes on
gradients, label = shape class) into ``.cache/demo-jpegs/`` under the repository root (or
``--data DIR``) and reuses it afterwards. Run it with ``make demo``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

import stoker
from jpeg_dataset import NUM_CLASSES, JpegFolder, generate, is_complete

EXAMPLES_DIR = Path(__file__).resolve().parent
DEFAULT_DATA = EXAMPLES_DIR.parent / ".cache" / "demo-jpegs"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="dataset cache directory")
    p.add_argument("--images", type=int, default=3000, help="number of images in the dataset")
    p.add_argument("--epochs", type=int, default=15, help="epochs per loader")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2, help="num_workers for both loaders")
    p.add_argument("--warmup", type=int, default=5, help="untimed batches at the start of each run")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def ensure_dataset(root: Path, images: int) -> None:
    if is_complete(root, images):
        print(f"dataset: reusing {images} JPEGs in {root}")
        return
    start = time.perf_counter()
    with tqdm(total=images, desc="generating JPEGs", unit="img", leave=False) as bar:
        generate(root, images, progress=lambda n: bar.update(n - bar.n))
    print(f"dataset: generated {images} JPEGs in {root} ({time.perf_counter() - start:.1f} s)")


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, kernel_size=5, stride=4, padding=2),
        nn.ReLU(),
        nn.Conv2d(16, 32, kernel_size=3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveMaxPool2d(1),
        nn.Flatten(),
        nn.Linear(32, NUM_CLASSES),
    )


def train(name: str, loader_cls, dataset: JpegFolder, args: argparse.Namespace) -> dict:
    """Train a fresh model for ``args.epochs`` epochs on batches from ``loader_cls``."""
    torch.manual_seed(args.seed)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = loader_cls(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        generator=torch.Generator().manual_seed(args.seed),
    )

    epoch_losses = []
    batches = timed_images = 0
    start = None
    with tqdm(total=args.epochs * len(dataset), desc=name, unit="img") as bar:
        for _ in range(args.epochs):
            loss_sum, loss_n = 0.0, 0
            for images, labels in loader:
                x = images.float() / 255
                loss = nn.functional.cross_entropy(model(x), labels)
                opt.zero_grad()
                loss.backward()
                opt.step()

                loss_sum += loss.item()
                loss_n += 1
                batches += 1
                bar.update(len(labels))
                if start is not None:
                    timed_images += len(labels)
                elif batches == args.warmup:
                    start = time.perf_counter()
            epoch_losses.append(loss_sum / loss_n)
    seconds = time.perf_counter() - start
    return {
        "name": name,
        "ips": timed_images / seconds,
        "seconds": seconds,
        "first_loss": epoch_losses[0],
        "last_loss": epoch_losses[-1],
    }


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.warmup < 1 or args.warmup >= args.epochs * args.images // args.batch_size:
        sys.exit("--warmup must be at least 1 and leave some batches to time")
    # Workers that start a fresh interpreter must be able to import jpeg_dataset too.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(EXAMPLES_DIR), os.environ.get("PYTHONPATH")) if p
    )
    torch.set_num_threads(1)  # leave the other cores to the loader workers

    ensure_dataset(args.data, args.images)
    dataset = JpegFolder(args.data, crop=128, train=True)
    print(
        f"training a tiny CNN: {args.epochs} epochs x {len(dataset)} images, "
        f"batch_size={args.batch_size}, num_workers={args.workers}, "
        f"{os.cpu_count()} CPUs (first {args.warmup} batches of each run untimed)"
    )

    results = [
        train("stoker.DataLoader", stoker.DataLoader, dataset, args),
        train("torch.utils.data.DataLoader", torch.utils.data.DataLoader, dataset, args),
    ]

    print()
    print(f"{'loader':<28} {'images/s':>9} {'time':>8}   loss (first -> last epoch)")
    for r in results:
        print(
            f"{r['name']:<28} {r['ips']:>9.0f} {r['seconds']:>7.1f}s"
            f"   {r['first_loss']:.3f} -> {r['last_loss']:.3f}"
        )
    print(f"\nstoker / torch throughput: {results[0]['ips'] / results[1]['ips']:.2f}x")
    if all(r["last_loss"] == results[1]["last_loss"] for r in results):
        print("identical losses: both loaders yielded the same batches (same order and crops)")


if __name__ == "__main__":
    main()
