"""One epoch of a bench workload through stoker, the bench's loop, in this process: samples/s
after the first batch and the main process's CPU ms per batch. For A/B runs of two builds of the
extension (copy each build's _stoker*.so into python/stoker/ in turn, a fresh process per run):

    PYTHONPATH=python .venv/bin/python benchmarks/one_epoch.py image 1
"""

from __future__ import annotations

import sys
import time

import torch

import stoker
from stoker.tools.bench.harness import Consumer
from stoker.tools.bench.workloads import WORKLOADS


def main(workload: str, workers: int) -> None:
    torch.set_num_threads(1)
    wl = WORKLOADS[workload]
    loader = stoker.DataLoader(wl.make("stoker"), batch_size=wl.batch_size, num_workers=workers,
                               shuffle=True, generator=torch.Generator().manual_seed(0),
                               collate_fn=wl.collate_fn)
    consume = Consumer()
    it = iter(loader)
    consume(next(it))
    n, t, cpu = 0, time.perf_counter(), time.process_time()
    for batch in it:
        consume(batch)
        del batch
        n += 1
    elapsed = time.perf_counter() - t
    print(f"{workload} {workers} workers: {n * wl.batch_size / elapsed:.0f} samples/s, "
          f"{1e3 * (time.process_time() - cpu) / n:.2f} ms main CPU a batch")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
