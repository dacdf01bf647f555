"""One rank of a checkpointed job, started by torchrun (CPU, gloo). argv: PHASE DIR.

save-K1,K2,..: rank r takes K_r batches of epoch 2 (ranks may stop at different batches, as a
    preempted job's do), saves its own state (DIR/state.RANK) and, gathered from all ranks with
    all_gather_object, the list of every rank's state (DIR/states, written by rank 0).
own: each rank loads its own state (same number of ranks) and finishes epoch 2, then epoch 3.
elastic: each rank loads the list of all saved ranks' states (another number of ranks) and
    finishes epoch 2, then epoch 3.
Each rank writes what it received to DIR/PHASE.RANK (JSON): the epoch-2 and epoch-3 batches.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.utils.data.distributed import DistributedSampler

import stoker
from resume_datasets import Augmented, indices

N, B = 48, 4


def main():
    phase, out = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ds = Augmented(N)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, seed=7)
    workers = 2 if phase.startswith("save") else rank  # resumed under other num_workers
    loader = stoker.DataLoader(ds, batch_size=B, sampler=sampler, num_workers=workers,
                               seed="per_sample")
    sampler.set_epoch(2)
    report = {"world": world, "rank": rank}
    if phase.startswith("save"):
        k = int(phase.split("-")[1].split(",")[rank])
        it = iter(loader)
        report["epoch2"] = indices(next(it) for _ in range(k))
        state = loader.state_dict()
        torch.save(state, os.path.join(out, f"state.{rank}"))
        states = [None] * world
        dist.all_gather_object(states, state)  # every rank's state, for an elastic resume
        if rank == 0:
            torch.save(states, os.path.join(out, "states"))
        del it
    else:
        if phase == "own":
            loader.load_state_dict(torch.load(os.path.join(out, f"state.{rank}")))
        else:
            loader.load_state_dict(torch.load(os.path.join(out, "states")))
        report["epoch2"] = indices(loader)
        sampler.set_epoch(3)
        report["epoch3"] = indices(loader)
        report["expected3"] = list(sampler)  # the sampler's own order for epoch 3
    dist.barrier()
    with open(os.path.join(out, f"{phase}.{rank}"), "w") as f:
        json.dump(report, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
