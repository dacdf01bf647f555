"""The image workload to a CUDA device, stoker against torch in the same run (run.sh calls it).

Each loader feeds the same loop: uint8 3x224x224 images in batches of 64, copied to the GPU and
read there by a small kernel. Loaders: torch (pin_memory=True, .to(non_blocking=True)), stoker
the same way (its slots are pinned: no copy), stoker with device="cuda" (it copies ahead).
Reported per loader, best of the rounds, second epoch of persistent workers (start-up excluded):
samples/s to the device, the host-to-device rate that gives, that rate over the machine's pinned
copy bandwidth measured here, and the main process's CPU time per batch (all its threads: torch's
pin thread counts). Usage: measure.py OUT.md"""

from __future__ import annotations

import os
import resource
import sys
import time

import torch

import stoker
from stoker.tools.bench.workloads import ImageTensors

BATCH, BATCHES, ROUNDS = 64, 60, 2
SAMPLE_BYTES = 3 * 224 * 224


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def pinned_bandwidth() -> float:
    """GB/s of one 256 MiB host-to-device copy from pinned memory (best of 3)."""
    src = torch.empty(256 << 20, dtype=torch.uint8).pin_memory()
    dst = torch.empty_like(src, device="cuda")
    best = 0.0
    for _ in range(3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src, non_blocking=True)
        b.record()
        b.synchronize()
        best = max(best, src.numel() / (a.elapsed_time(b) / 1e3) / 1e9)
    return best


def make(kind, workers):
    ds = ImageTensors(BATCH * BATCHES)
    if kind == "torch":
        return torch.utils.data.DataLoader(ds, batch_size=BATCH, num_workers=workers,
                                           pin_memory=True, persistent_workers=True)
    if kind == "stoker pin_memory":
        return stoker.DataLoader(ds, batch_size=BATCH, num_workers=workers, pin_memory=True,
                                 persistent_workers=True)
    return stoker.DataLoader(ds, batch_size=BATCH, num_workers=workers, device="cuda",
                             persistent_workers=True)


def epoch(loader, on_device: bool):
    acc = torch.zeros((), device="cuda")
    n = 0
    for x, _ in loader:
        if not on_device:
            x = x.to("cuda", non_blocking=True)
        acc += x[:, 0, ::16, ::16].float().mean()  # the step reads the batch on the GPU
        n += x.shape[0]
    torch.cuda.synchronize()
    return n


def measure(kind, workers):
    loader = make(kind, workers)
    on_device = kind.endswith("device")
    epoch(loader, on_device)  # start-up and first touch
    t0, c0 = time.perf_counter(), cpu_s()
    n = epoch(loader, on_device)
    wall, cpu = time.perf_counter() - t0, cpu_s() - c0
    del loader
    return n / wall, cpu / (n / BATCH)


def main(out_path):
    workers = max(1, min(8, (os.cpu_count() or 2) - 2))
    bw = pinned_bandwidth()
    kinds = ["torch", "stoker pin_memory", "stoker device"]
    best = {k: (0.0, float("inf")) for k in kinds}
    for _ in range(ROUNDS):
        for k in kinds:
            rate, cpu = measure(k, workers)
            best[k] = (max(best[k][0], rate), min(best[k][1], cpu))
    torch_rate = best["torch"][0]
    lines = [
        f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, {workers} workers, "
        f"{os.cpu_count()} CPUs; pinned H2D bandwidth measured here: {bw:.1f} GB/s",
        "",
        "| loader | samples/s to the GPU | vs torch | H2D GB/s | share of pinned bandwidth "
        "| main CPU ms/batch |",
        "|---|---|---|---|---|---|",
    ]
    for k in kinds:
        rate, cpu = best[k]
        gbs = rate * SAMPLE_BYTES / 1e9
        lines.append(f"| {k} | {rate:,.0f} | {rate / torch_rate:.2f}x | {gbs:.1f} | "
                     f"{gbs / bw:.2f} | {cpu * 1e3:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    with open(out_path, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "build/gpu.md")
