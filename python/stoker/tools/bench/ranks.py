"""``stoker bench --ranks R``: what R ranks of one job on this machine cost, each with its own
loader, as torchrun runs them (real processes with ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR=127.0.0.1``, a gloo group).

Two scenarios, each run ``rounds`` times (the median counts):

- **auto**: every rank's loader has ``num_workers="auto"`` over its ``DistributedSampler`` share
  of a CPU-bound dataset (``Busy``: a fixed amount of arithmetic a sample). Reported: the worker
  processes the ranks started between them (against the usable CPUs), their total PSS (ranks
  and workers, read in the middle of the first epoch, every worker alive), and the slowest
  rank's first batch of the first epoch (workers, and the pool, start) and of the second
  (``2nd epoch``: a new iterator, its workers started again; the pool already runs).
- **skewed lock-step**: ranks step together (a gloo barrier after every batch, as synchronous
  training does) and the samples of rank 0's share cost three times the others' (by index:
  ``DistributedSampler`` without shuffling gives rank r the indices ``i % R == r``); the same
  total number of workers, ``max(R, usable CPUs)``, divided among the ranks. Reported: the time
  of the second epoch (the slowest rank's; every rank waits for it at each barrier).

``--placement node`` adds, in the same run, the ranks served by one pool for the node
(``placement=stoker.Node()``): under "auto" the pool sizes itself (the usable CPUs less one per
rank) and a rank's ``num_workers`` is how many of its batches may be in flight; in the skewed
scenario the pool has the same total of workers, and each rank may have that many batches in
flight, so every worker can help the rank that is behind. The pool's processes are counted once
(its PSS read by rank 0, with its workers).

A command: one thread in this process; each rank is a fresh interpreter.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time

SAMPLES = 256  # per rank, in the skewed scenario; the auto one has 128 a rank
BATCH = 8
WORK = 40_000  # rounds of arithmetic a sample (about 2 ms on an idle core)
SKEW = 3  # rank 0's samples cost this many times the others'


class Busy:
    """A map-style dataset whose samples cost `work` rounds of arithmetic, `skew` times that
    for the indices of rank 0's share (``i % ranks == 0``)."""

    def __init__(self, n: int, work: int, ranks: int = 1, skew: int = 1):
        self.n, self.work, self.ranks, self.skew = n, work, ranks, skew

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch

        rounds = self.work * (self.skew if i % self.ranks == 0 else 1)
        x = 0
        for k in range(rounds):
            x += k * k
        return torch.full((64,), float(i)), x & 0xFF


def rank_main(scenario: str, num_workers, placement: str = "local",
              pool_workers=None) -> dict:
    """One rank (its variables set by ``run_ranks``): one epoch of its loader; `placement`
    "node": served by the node's pool of `pool_workers` ("auto" when None)."""
    import psutil
    import torch
    import torch.distributed as dist
    from torch.utils.data.distributed import DistributedSampler

    import stoker

    from .harness import total_pss

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    skewed = scenario == "skewed"
    n = (SAMPLES if skewed else SAMPLES // 2) * world
    ds = Busy(n, WORK, world, SKEW if skewed else 1)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=False)
    where = stoker.Node(workers=pool_workers or "auto") if placement == "node" else None
    dl = stoker.DataLoader(ds, batch_size=BATCH, sampler=sampler, num_workers=num_workers,
                           placement=where)
    pids: set = set()
    pool = None
    pss = 0
    firsts, epochs = [], []
    for epoch in range(2):  # the first pays for starting (workers; the pool), the second not
        sampler.set_epoch(epoch)
        dist.barrier()
        t0 = time.perf_counter()
        it = iter(dl)
        next(it)
        firsts.append(time.perf_counter() - t0)
        for step, _ in enumerate(it, 1):
            st = dl.stats()
            pool = st.get("pool") or pool
            if epoch == 0:  # (a new epoch's iterator starts local workers anew)
                pids.update(pool["pids"] if pool else (w["pid"] for w in st["workers"]
                                                       if w["pid"]))
            if epoch == 0 and step == len(dl) // 2:
                # mid-epoch, every worker alive (a local loader's end with its epoch)
                pss = total_pss(psutil.Process())  # this rank and its workers
                if pool and rank == 0:  # the pool and its workers, once
                    pss += total_pss(psutil.Process(pool["pid"]))
            if skewed:
                dist.barrier()
        epochs.append(time.perf_counter() - t0)
        del it
    dist.destroy_process_group()
    return {"rank": rank, "num_workers": dl.num_workers, "started": len(pids),
            "pool_pids": sorted(pids) if pool else None, "first_batch_s": firsts[0],
            "warm_first_batch_s": firsts[1], "epoch_s": epochs[1],
            "first_epoch_s": epochs[0], "pss_bytes": pss}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(ranks: int, scenario: str, num_workers, timeout: float = 300,
              placement: str = "local", pool_workers=None) -> list[dict]:
    """Starts `ranks` ranks of one job on this machine and returns each one's result."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
               WORLD_SIZE=str(ranks), LOCAL_WORLD_SIZE=str(ranks), OMP_NUM_THREADS="1",
               PYTHONWARNINGS="ignore")
    code = (f"import json; from stoker.tools.bench.ranks import rank_main; "
            f"print('RESULT', json.dumps(rank_main({scenario!r}, {num_workers!r}, "
            f"{placement!r}, {pool_workers!r})))")
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)))
             for r in range(ranks)]
    out = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=timeout)
            res = [json.loads(line[len("RESULT "):]) for line in stdout.splitlines()
                   if line.startswith("RESULT ")]
            if p.returncode != 0 or not res:
                raise RuntimeError(f"a rank failed ({p.returncode}): {stderr.strip()[-2000:]}")
            out.append(res[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return sorted(out, key=lambda r: r["rank"])


def work_bound(ranks: int, cpus: int, rounds: int = 3) -> float:
    """The least time the skewed epoch's work itself takes here: its samples, split evenly
    between `cpus` forked processes that compute them at once (no loader, no messages, no
    batches), the best of `rounds`. Run beside each other they contend as a loader's workers
    do (two vCPUs may be one core's two threads), so the figure is what this machine can do.
    No loader doing this work can beat it."""
    import torch  # noqa: F401 (imported once here, not in each child)

    ds = Busy(SAMPLES * ranks, WORK, ranks, SKEW)
    ds[0]
    n = max(1, cpus)
    shares: list[list[int]] = [[] for _ in range(n)]
    load = [0] * n
    for i in range(len(ds)):  # each sample to the least loaded process: an even split
        c = load.index(min(load))
        shares[c].append(i)
        load[c] += SKEW if i % ranks == 0 else 1
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        pids = []
        for share in shares:
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    for i in share:
                        ds[i]
                    code = 0
                finally:
                    os._exit(code)
            pids.append(pid)
        for pid in pids:
            if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0:
                raise RuntimeError("the bound's process failed: no bound measured")
        best = min(best, time.perf_counter() - t0)
    return best


def _median_run(runs: list[list[dict]], key) -> list[dict]:
    ordered = sorted(runs, key=key)
    return ordered[len(ordered) // 2]


def _started(reps: list[dict]) -> int:
    """Worker processes the ranks started between them (a pool's counted once)."""
    if reps[0].get("pool_pids") is not None:
        return len({p for r in reps for p in r["pool_pids"]})
    return sum(r["started"] for r in reps)


def main(ranks: int = 4, rounds: int = 3, out=sys.stdout, placements=("local",),
         rank_workers="auto") -> dict:
    from ...common.system import usable_cpus

    cpus = usable_cpus()
    result: dict = {"ranks": ranks, "usable_cpus": cpus, "auto": {}, "skewed": {}}
    print(f"{ranks} ranks of one job on this machine ({cpus} usable CPUs), each its own "
          f"loader; {rounds} rounds, the median", file=out)
    print(f"auto: num_workers={rank_workers!r} on every rank, {SAMPLES // 2} samples a rank"
          " (the node's pool sizes itself: auto)", file=out)
    print(f"{'placement':>10} {'workers':>8} {'of CPUs':>8} {'total PSS':>10} "
          f"{'1st batch':>10} {'2nd epoch':>10}", file=out)
    for placement in placements:
        runs = [run_ranks(ranks, "auto", rank_workers, placement=placement)
                for _ in range(rounds)]
        reps = _median_run(runs, _started)
        started = _started(reps)
        pss = sum(r["pss_bytes"] for r in reps)
        first = max(r["first_batch_s"] for r in reps)
        warm = max(r["warm_first_batch_s"] for r in reps)
        result["auto"][placement] = {"started": started, "per_rank": [r["started"] for r in reps],
                                     "pss_bytes": pss, "first_batch_s": first,
                                     "warm_first_batch_s": warm}
        print(f"{placement:>10} {started:>8} {started / cpus:7.1f}x {pss / 2**20:8.0f} MB "
              f"{1e3 * first:8.0f} ms {1e3 * warm:8.0f} ms", file=out)
    total = max(ranks, cpus)
    print(f"skewed lock-step: a barrier per batch, rank 0's samples cost {SKEW}x; {total} "
          f"workers in all, {SAMPLES} samples a rank", file=out)
    print(f"{'placement':>10} {'workers':>8} {'epoch':>9} {'rounds':>20}  (the second epoch: "
          "the first also starts workers)", file=out)
    for placement in placements:
        node = placement == "node"
        per_rank = max(1, total // ranks)
        epochs = []
        for _ in range(rounds):
            reps = run_ranks(ranks, "skewed", total if node else per_rank, placement=placement,
                             pool_workers=per_rank * ranks if node else None)
            epochs.append(max(r["epoch_s"] for r in reps))
        median = statistics.median(epochs)
        result["skewed"][placement] = {"workers": per_rank * ranks, "epoch_s": median,
                                       "workers_per_rank": None if node else per_rank,
                                       "rounds": epochs}
        print(f"{placement:>10} {per_rank * ranks:>8} {median:8.2f}s "
              f"{' '.join(f'{e:.2f}' for e in epochs):>20}", file=out)
    bound = work_bound(ranks, cpus)
    result["skewed"]["bound_s"] = bound
    print(f"the work itself on {cpus} CPUs: at least {bound:.2f}s (its samples computed by "
          f"{cpus} plain processes at once, no loader); "
          + ", ".join(f"{p} {result['skewed'][p]['epoch_s'] / bound:.2f}x of it"
                      for p in placements), file=out)
    if "node" in placements and "local" in placements:
        ratio = result["skewed"]["node"]["epoch_s"] / result["skewed"]["local"]["epoch_s"]
        result["skewed"]["node_over_local"] = ratio
        print(f"node / local epoch: {ratio:.2f}x (the best any loader could do here: "
              f"{bound / result['skewed']['local']['epoch_s']:.2f}x)", file=out)
    return result
