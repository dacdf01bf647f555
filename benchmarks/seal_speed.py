"""How long sealing a dataset for spawn/forkserver workers takes (``wire.sealed.Sealed``: the
one pickle every worker maps), for a dataset of many small Python objects, where a pickler's
per-object cost shows: `--items` dicts of a path, a label and a box, and one 64-float array per
ten items. Best of `--rounds`, torch imported (as under a training script).

    .venv/bin/python benchmarks/seal_speed.py [--items 500000] [--rounds 5]

To compare two versions of stoker, run it under each (PYTHONPATH=their python/ folder, with the
built extension beside it) in alternating runs.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch  # noqa: F401 (stoker's pickling rules look for it)

from stoker.wire.sealed import Sealed


class Metadata:
    def __init__(self, n: int):
        self.items = [{"path": f"/data/{i}.jpg", "label": i % 1000, "box": [i, i + 1, 2.5]}
                      for i in range(n)]
        self.arrays = [np.full(64, i, dtype=np.float32) for i in range(n // 10)]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--items", type=int, default=500_000)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    ds = Metadata(a.items)
    best = float("inf")
    for _ in range(a.rounds):
        t0 = time.perf_counter()
        sealed = Sealed((ds, None, None))
        best = min(best, time.perf_counter() - t0)
        sealed.close()
    print(f"sealed {a.items:,} dicts and {a.items // 10:,} arrays: {best * 1000:.0f} ms "
          f"(best of {a.rounds})")


if __name__ == "__main__":
    main()
