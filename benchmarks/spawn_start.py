"""Spawn start-up and memory: stoker against torch, each in its own process.

A map-style dataset holding SIZE_MB of NumPy arrays in memory, `--workers` workers started with
`--method` (spawn or forkserver). For each loader: seconds from `iter()` to the first batch, and
the total PSS (proportional set size: shared pages counted once overall) of the main process and
its workers at the first batch, as a multiple of the main process's PSS before `iter()`.

    .venv/bin/python benchmarks/spawn_start.py [--size-mb 400] [--workers 4] [--method spawn]

`--local-class` adds a run of stoker with the dataset's class defined in a function, which pickle
refuses and stoker carries by value (torch cannot start it): its arrays still go beside the
pickle, shared by every worker.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def children(pid: int) -> list[int]:
    out = []
    try:
        for t in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{t}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    for c in list(out):
        out += children(c)
    return out


class Arrays:
    def __init__(self, size_mb: int, sample_kb: int = 256):
        import numpy as np

        n = size_mb * 1024 // sample_kb
        rng = np.random.default_rng(0)
        self.items = [rng.integers(0, 255, sample_kb * 1024, dtype=np.uint8) for _ in range(n)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i][:1024].astype("float32")


def _local_class():
    class LocalArrays(Arrays):  # pickle cannot find it by name: it goes by value
        pass

    return LocalArrays


def one(who: str, size_mb: int, workers: int, method: str) -> dict:
    import torch

    if who.startswith("stoker"):
        import stoker

        DataLoader = stoker.DataLoader
    else:
        DataLoader = torch.utils.data.DataLoader
    ds = (_local_class() if who == "stoker-local-class" else Arrays)(size_mb)
    base = pss_kb(os.getpid())
    loader = DataLoader(ds, batch_size=16, num_workers=workers, multiprocessing_context=method)
    t0 = time.perf_counter()
    it = iter(loader)
    first = next(it)
    first_s = time.perf_counter() - t0
    time.sleep(0.5)  # every worker has started by now (the first batch needs only one)
    total = pss_kb(os.getpid()) + sum(pss_kb(c) for c in children(os.getpid()))
    n = 1 + sum(1 for _ in it)
    assert n == len(loader), (n, len(loader))
    assert float(first.sum()) == float(sum(ds[i].sum() for i in range(16)))
    return {"loader": who, "first_batch_s": round(first_s, 2),
            "pss_x": round(total / base, 2), "base_mb": base // 1024, "total_mb": total // 1024}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--size-mb", type=int, default=400)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--method", default="spawn")
    p.add_argument("--only", default="")
    p.add_argument("--local-class", action="store_true")
    a = p.parse_args()
    if a.only:
        print(json.dumps(one(a.only, a.size_mb, a.workers, a.method)))
        return
    for who in ("torch", "stoker") + (("stoker-local-class",) if a.local_class else ()):
        out = subprocess.run([sys.executable, __file__, "--only", who, "--size-mb", str(a.size_mb),
                              "--workers", str(a.workers), "--method", a.method],
                             capture_output=True, text=True, check=True)
        print(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
