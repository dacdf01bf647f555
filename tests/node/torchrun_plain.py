"""A plain torch training loop's loader, unchanged: run as `torchrun --nproc-per-node 2 -m stoker
run --placement node torchrun_plain.py REPORT`. Writes REPORT.<rank>.json: the indices this rank
received and the pool that served it."""

import json
import os
import sys

import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from node_datasets import Values  # noqa: E402


def main():
    dist.init_process_group("gloo")
    ds = Values()
    dl = DataLoader(ds, batch_size=4, sampler=DistributedSampler(ds, shuffle=False),
                    num_workers=2)
    got, pool = [], None
    for b in dl:
        got += b["index"].tolist()
        if pool is None:
            import stoker

            pool = stoker.stats(dl).get("pool")
        dist.barrier()
    with open(f"{sys.argv[1]}.{dist.get_rank()}.json", "w") as f:
        json.dump({"indices": got, "pool": pool}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
