"""The bound of a workload: what the work itself costs, timed in one process with no loader.

Per batch, a worker must load its samples and lay them out as one batch (``collate_into``:
every tensor field stacked into a buffer reused from batch to batch, one copy, as any loader
must make at least once; a workload's own ``collate_fn`` is called as it is), and the main process
must read it (the consumer's copy, as the bench's ``Consumer`` does for every loader). With
``cores`` CPUs no loader can deliver more than

    min(cores / (worker + main), 1 / main) batches per second

(the work spread over every core, or the main process alone at full speed). ``stoker bench``
measures this in every round, in a fresh interpreter like the loaders', and prints each
loader's share of it.

Runs in the interpreter that calls it (``harness.in_fresh_interpreter``).
"""

from __future__ import annotations

import time

WARM = 2  # untimed batches that warm the buffers; then the rest of one epoch is timed, as the
# loaders' runs are (a shorter run read this machine's speed over a tenth of a second)


def collate_into(samples, buffers: dict, path=()):
    """`samples` (one batch's) as one batch; tensors stacked into `buffers` (by field path),
    kept from one batch to the next."""
    import torch

    first = samples[0]
    if isinstance(first, torch.Tensor):
        shape = (len(samples),) + tuple(first.shape)
        buf = buffers.get(path)
        if buf is None or tuple(buf.shape) != shape or buf.dtype != first.dtype:
            buf = buffers[path] = torch.empty(shape, dtype=first.dtype)
        return torch.stack(samples, out=buf)
    if isinstance(first, dict):
        return {k: collate_into([s[k] for s in samples], buffers, path + (k,)) for k in first}
    if isinstance(first, (tuple, list)):
        return [collate_into([s[k] for s in samples], buffers, path + (k,))
                for k in range(len(first))]
    if isinstance(first, (int, float)):
        return torch.tensor(samples)
    return list(samples)


def measure(workload_name: str, who: str = "torch") -> dict:
    """Seconds per batch of the worker's share and of the main process's; the bound. `who`: the
    loader whose form of the dataset does the work (most workloads have one form; `metadata`
    holds a list of dicts for torch, a ``stoker.SharedList`` for stoker)."""
    import torch

    from ...common import system as _system
    from .harness import Consumer
    from .workloads import WORKLOADS

    torch.set_num_threads(1)
    wl = WORKLOADS[workload_name]
    ds = wl.make(who)
    g = torch.Generator().manual_seed(0)
    order = torch.randperm(len(ds), generator=g).tolist()
    bs = wl.batch_size
    n = len(ds) // bs
    buffers: dict = {}
    consume = Consumer()
    worker_s = main_s = 0.0
    for b in range(n):
        t0 = time.perf_counter()
        samples = [ds[i] for i in order[b * bs:(b + 1) * bs]]
        batch = wl.collate_fn(samples) if wl.collate_fn else collate_into(samples, buffers)
        t1 = time.perf_counter()
        consume(batch)
        t2 = time.perf_counter()
        if b >= WARM:
            worker_s += t1 - t0
            main_s += t2 - t1
    if n <= WARM or worker_s + main_s <= 0:
        raise ValueError(f"{workload_name}: too few batches ({n}) to time the work")
    worker_s, main_s = worker_s / (n - WARM), main_s / (n - WARM)
    cores = _system.usable_cpus()
    per_s = min(cores / (worker_s + main_s), 1.0 / main_s if main_s > 0 else float("inf"))
    return {"workload": workload_name, "form": who, "worker_ms_per_batch": 1e3 * worker_s,
            "main_ms_per_batch": 1e3 * main_s, "cores": cores,
            "bound_samples_per_s": per_s * bs}
