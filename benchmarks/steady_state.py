"""Where a bench workload's time goes once the pipeline is full: persistent workers, one warm-up
epoch, then EPOCHS epochs timed; CPU milliseconds per delivered batch of the main process and of
each child (its workers; psutil), and the whole machine's idle share (/proc/stat, every CPU, not
only this process's cpuset) over the same window. Idle CPU while workers exist means something
waits: a worker for its next task, the main process for the next batch in order.

    PYTHONPATH=python .venv/bin/python benchmarks/steady_state.py image --workers 2 \
        [--epochs 4] [--prefetch-factor 2] [--out-of-order]
"""

from __future__ import annotations

import argparse
import time

import psutil
import torch

import stoker
from stoker.tools.bench.harness import Consumer
from stoker.tools.bench.workloads import WORKLOADS


def _cpu_seconds(me: psutil.Process) -> dict:
    out = {}
    for p in [me] + me.children(recursive=True):
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        out[p.pid] = t.user + t.system
    return out


def _machine_times() -> list[int]:
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload", choices=sorted(WORKLOADS))
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--prefetch-factor", type=int, default=2)
    ap.add_argument("--out-of-order", action="store_true", help="in_order=False")
    args = ap.parse_args()
    if args.workers < 1 or args.epochs < 1:
        ap.error("--workers and --epochs must be 1 or more")
    torch.set_num_threads(1)
    wl = WORKLOADS[args.workload]
    loader = stoker.DataLoader(
        wl.make("stoker"), batch_size=wl.batch_size, num_workers=args.workers, shuffle=True,
        generator=torch.Generator().manual_seed(0), collate_fn=wl.collate_fn,
        persistent_workers=True, prefetch_factor=args.prefetch_factor,
        in_order=not args.out_of_order)
    consume = Consumer()
    for batch in loader:  # warm-up: workers started, slots made, buffers touched
        consume(batch)
    me = psutil.Process()
    cpu0, machine0, t0, n = _cpu_seconds(me), _machine_times(), time.perf_counter(), 0
    for _ in range(args.epochs):
        for batch in loader:
            consume(batch)
            n += 1
    elapsed = time.perf_counter() - t0
    cpu1, machine1 = _cpu_seconds(me), _machine_times()
    d = [b - a for a, b in zip(machine0, machine1)]
    # children: the workers (and any helper process, such as a resource tracker)
    per_batch = {("main" if pid == me.pid else f"child {pid}"): 1e3 * (c - cpu0.get(pid, 0.0)) / n
                 for pid, c in cpu1.items()}
    print(f"{args.workload}, {args.workers} workers, prefetch_factor {args.prefetch_factor}"
          f"{', out of order' if args.out_of_order else ''}: "
          f"{n * wl.batch_size / elapsed:.0f} samples/s, {1e3 * elapsed / n:.2f} ms a batch")
    print("  CPU ms a batch: " + ", ".join(f"{k} {v:.2f}" for k, v in per_batch.items()))
    print(f"  machine idle {100 * d[3] / sum(d):.0f}%, steal {100 * d[7] / sum(d):.0f}%")


if __name__ == "__main__":
    main()
