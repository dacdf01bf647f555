"""stoker demo: the same small training loop fed by ``stoker.DataLoader`` and by torch's.

Act one, a clean run:

* ``stoker.DataLoader`` is a drop-in replacement for ``torch.utils.data.DataLoader``: both are
  built with exactly the same arguments (an ordinary map-style ``Dataset``, ``batch_size``,
  ``shuffle`` with a seeded ``generator``, ``num_workers``) and the loop body is identical.
* The workload is data-loading heavy: every sample is a JPEG decoded with Pillow, randomly
  cropped and flipped (torch RNG, so per-worker seeding matters), and collated into uint8
  batches, while the main process runs one SGD step of a tiny CNN per batch.
* It prints the throughput (images/s) of both loaders side by side, the mean loss of the first
  and last epoch of each (both start from the same weights and the same seeded ``generator``,
  so a loader that reproduces torch's sampling order and per-worker seeding ends with exactly
  the same loss), and what throughput alone hides on a machine whose cores are all decoding:
  the main process's CPU per batch spent outside the training step, the loader's own cost,
  taken from the core the training loop needs.

Act two, the same job on a bad night: one JPEG is corrupt and crashes its decoder with a
segmentation fault, and a worker is killed mid-epoch (as the OOM killer does). torch's loader
stops at the first of them, with its message. stoker's, with ``on_error="skip"``, restarts the
dead workers, re-issues their batches, quarantines the sample that keeps crashing, names both
deaths with the sample they were loading, and finishes; its losses are printed beside the clean
run's.

On first use it generates a small deterministic JPEG dataset (procedurally drawn shapes on
gradients, label = shape class) into ``.cache/demo-jpegs/`` under the repository root (or
``--data DIR``) and reuses it afterwards. Run it with ``make demo``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

import stoker
from jpeg_dataset import NUM_CLASSES, CrashesOn, JpegFolder, generate, is_complete

EXAMPLES_DIR = Path(__file__).resolve().parent
DEFAULT_DATA = EXAMPLES_DIR.parent / ".cache" / "demo-jpegs"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="dataset cache directory")
    p.add_argument("--images", type=int, default=3000, help="number of images in the dataset")
    p.add_argument("--epochs", type=int, default=6, help="epochs per loader in act one")
    p.add_argument("--fault-epochs", type=int, default=3,
                   help="epochs of act two (0: no act two)")
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


def worker_pids() -> list[int]:
    """The loader's worker processes: this process's children (read from /proc, whichever
    loader started them)."""
    me, out = str(os.getpid()), []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[1] == me:
                        out.append(int(p))
            except OSError:
                pass
    return sorted(out)


def train(name: str, loader_cls, dataset, args: argparse.Namespace, epochs: int,
          kill_at=None, **options) -> dict:
    """Train a fresh model for `epochs` epochs on batches from `loader_cls`; `kill_at`: (epoch,
    batch) at which a worker is SIGKILLed, as the OOM killer would. Returns the throughput,
    the losses, the main process's CPU per batch outside the training step, and the error that
    ended the run early, if one did."""
    torch.manual_seed(args.seed)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = loader_cls(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        generator=torch.Generator().manual_seed(args.seed),
        **options,
    )

    epoch_losses = []
    batches = timed_images = timed_batches = 0
    start = cpu_start = None
    step_cpu = 0.0
    error = None
    with tqdm(total=epochs * len(dataset), desc=name, unit="img", leave=False) as bar:
        try:
            for epoch in range(epochs):
                loss_sum, loss_n, step = 0.0, 0, -1
                for step, (images, labels) in enumerate(loader):
                    t0 = time.thread_time()
                    x = images.float() / 255
                    loss = nn.functional.cross_entropy(model(x), labels)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    loss_sum += loss.item()
                    if start is not None:
                        step_cpu += time.thread_time() - t0
                        timed_images += len(labels)
                        timed_batches += 1
                    loss_n += 1
                    batches += 1
                    bar.update(len(labels))
                    if start is None and batches == args.warmup:
                        start, cpu_start = time.perf_counter(), time.process_time()
                    if kill_at == (epoch, step):
                        os.kill(worker_pids()[0], signal.SIGKILL)
                epoch_losses.append(loss_sum / loss_n)
        except Exception as e:  # what ends the run: the demo shows it
            error = (f"{type(e).__name__}: {str(e).splitlines()[0]}", epoch, step + 1)
    end, cpu_end = time.perf_counter(), time.process_time()
    seconds = end - start if start is not None else 0.0
    return {
        "name": name,
        "ips": timed_images / seconds if seconds else 0.0,
        "seconds": seconds,
        "losses": epoch_losses,
        "loader_cpu_ms": (1e3 * ((cpu_end - cpu_start) - step_cpu) / timed_batches
                          if timed_batches else 0.0),
        "error": error,
        "loader": loader,
    }



def act_one(dataset, args) -> list[dict]:
    """The clean run: stoker's loader, then torch's, with the same arguments."""
    results = [
        train("stoker.DataLoader", stoker.DataLoader, dataset, args, args.epochs),
        train("torch.utils.data.DataLoader", torch.utils.data.DataLoader, dataset, args,
              args.epochs),
    ]
    print()
    print(f"{'loader':<28} {'images/s':>9} {'time':>8}   loss (first -> last epoch)"
          "   main-process CPU a batch, outside the step")
    for r in results:
        print(f"{r['name']:<28} {r['ips']:>9.0f} {r['seconds']:>7.1f}s"
              f"   {r['losses'][0]:.3f} -> {r['losses'][-1]:.3f}"
              f"          {r['loader_cpu_ms']:.2f} ms")
    s, t = results
    print(f"\nstoker / torch throughput: {s['ips'] / t['ips']:.2f}x (on a machine whose cores "
          "all decode, both loaders run at its limit).")
    print(f"What throughput hides: the loader's own CPU in the training process, "
          f"{s['loader_cpu_ms']:.2f} ms a batch for stoker against {t['loader_cpu_ms']:.2f} ms "
          f"for torch ({s['loader_cpu_ms'] / t['loader_cpu_ms']:.0%}), taken from the core "
          "that runs the training step and feeds the GPU.")
    if s["losses"] == t["losses"]:
        print("Identical losses: both loaders yielded the same batches (same order and crops).")
    return results


def act_two(dataset, clean: dict, args) -> None:
    """A corrupt JPEG that segfaults its decoder, and a worker killed in the first epoch. Both
    loaders fork their workers here, so that the worker to kill is a child of this process
    (under forkserver, Python 3.14's default, they are the fork server's)."""
    bad = len(dataset) // 2 + 1
    faulty = CrashesOn(dataset, bad)
    kill_at = (0, 8)
    epochs = min(args.fault_epochs, len(clean["losses"]))
    print(f"\nAct two, a bad night: dataset index {bad} is a corrupt JPEG whose decoder "
          f"segfaults, and a worker is SIGKILLed at batch {kill_at[1] + 1} of the first epoch "
          "(as the OOM killer does).")
    for what, ds, at in (("a worker killed", dataset, kill_at), ("the corrupt JPEG", faulty, None)):
        r = train("torch.utils.data.DataLoader", torch.utils.data.DataLoader, ds, args,
                  epochs, kill_at=at, multiprocessing_context="fork")
        if r["error"]:
            msg, epoch, step = r["error"]
            print(f"torch, {what}: the run stops in epoch {epoch + 1}, batch {step}:\n    {msg}")
        else:
            print(f"torch, {what}: finished")
    r = train("stoker.DataLoader", stoker.DataLoader, faulty, args, epochs, kill_at=kill_at,
              on_error="skip", multiprocessing_context="fork")
    if r["error"]:
        print(f"stoker: the run stops: {r['error'][0]}")
        return
    loader = r["loader"]
    print(f"stoker, both faults in one run (on_error=\"skip\"): all {epochs} epochs done. What "
          "happened, from loader.deaths and loader.skipped:")
    for d in loader.deaths:
        print(f"    died: {d}")
    for s in loader.skipped:
        print(f"    left out: dataset index {s.index} (epoch {s.epoch}): {s.reason}")
    print("Losses by epoch:")
    print(f"    clean run         {'  '.join(f'{v:.4f}' for v in clean['losses'][:epochs])}")
    print(f"    with both faults  {'  '.join(f'{v:.4f}' for v in r['losses'])}")
    print("(the killed worker's batches were loaded again, the same batches; the corrupt sample "
          "is left out of its batch, the one difference)")


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
        f"Act one, a clean run: a tiny CNN, {args.epochs} epochs x {len(dataset)} images, "
        f"batch_size={args.batch_size}, num_workers={args.workers}, "
        f"{os.cpu_count()} CPUs (first {args.warmup} batches of each run untimed)"
    )
    results = act_one(dataset, args)
    if args.fault_epochs > 0:
        act_two(dataset, results[0], args)


if __name__ == "__main__":
    main()
