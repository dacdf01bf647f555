"""``stoker bench --main-cost``: the loader's own CPU in the main process, per batch and per
tensor, stoker against torch.

A dataset returns a dict of K float tensors of 8 elements; batch 64, 2 persistent workers; the
loop only drops each batch (no consumer). Main-process CPU (``time.process_time``) per batch is
the least of 3 epochs, for K = 1 and K = 128; the slope between them is the cost of one tensor
(a collated batch holds K tensors), the intercept the cost of a batch.
"""

from __future__ import annotations

import json
import sys
import time

import torch

KS = (1, 128)
BATCH = 64


class KTensors(torch.utils.data.Dataset):
    def __init__(self, k, n=BATCH * 200):
        self.k = k
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {f"t{j}": torch.full((8,), float(i)) for j in range(self.k)}


def run_in_process(who: str, k: int) -> float:
    """Microseconds of main-process CPU per batch (the least of 3 epochs)."""
    import stoker

    torch.set_num_threads(1)
    if who == "torch":
        dl = torch.utils.data.DataLoader(KTensors(k), batch_size=BATCH, num_workers=2,
                                         persistent_workers=True)
    else:
        dl = stoker.DataLoader(KTensors(k), batch_size=BATCH, num_workers=2,
                               persistent_workers=True, stall_notice=None)
    for _ in dl:  # warm: workers started, slots grown
        pass
    best = float("inf")
    for _ in range(3):
        c0 = time.process_time()
        n = 0
        for _ in dl:
            n += 1
        best = min(best, 1e6 * (time.process_time() - c0) / n)
    return best


def _run(who, k, timeout=300) -> float:
    from .harness import in_fresh_interpreter

    res, stderr = in_fresh_interpreter("main_cost", "run_in_process", (who, k), timeout)
    if res is None:
        raise RuntimeError(f"{who}, {k} tensors: {stderr.strip()[-2000:]}")
    return float(res)


def main(out=sys.stdout) -> dict:
    result = {}
    print(f"{'loader':8} {'us/batch':>9} {'us/tensor':>10}   (main-process CPU, no consumer)",
          file=out)
    for who in ("torch", "stoker"):
        lo, hi = (_run(who, k) for k in KS)
        per_tensor = (hi - lo) / (KS[1] - KS[0])
        per_batch = lo - per_tensor * KS[0]
        result[who] = {"us_per_batch": per_batch, "us_per_tensor": per_tensor,
                       "us_at": dict(zip(map(str, KS), (lo, hi)))}
        print(f"{who:8} {per_batch:9.0f} {per_tensor:10.2f}", file=out)
    return result


if __name__ == "__main__":
    json.dump(main(), sys.stdout)
