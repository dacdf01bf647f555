"""One rank of a node-placement test: `rank.py SCENARIO REPORT [placement]`.

RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT come from the test
(or torchrun). Writes REPORT.<rank>.json: per epoch the indices received and the values, and the
pool this rank was served by.
"""

import json
import os
import signal
import sys
import time

import torch
from torch.utils.data import DistributedSampler

import stoker

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from node_datasets import Counted, Prints, Values, WithList  # noqa: E402


def _write(path: str, out: dict) -> None:
    """The report, whole or not at all: a test that waits for the file to exist reads it at
    once (written in place, it was once read empty)."""
    with open(path + ".part", "w") as f:
        json.dump(out, f)
    os.replace(path + ".part", path)


def loader(ds, placement, replicas=None, rank=None, **kw):
    world = int(os.environ["WORLD_SIZE"]) if replicas is None else replicas
    r = int(os.environ["RANK"]) if rank is None else rank
    sampler = DistributedSampler(ds, num_replicas=world, rank=r, shuffle=True, seed=3)
    kw.setdefault("num_workers", 2)
    return stoker.DataLoader(ds, batch_size=4, sampler=sampler, placement=placement,
                             seed="per_sample", **kw), sampler


def main():
    scenario, report = sys.argv[1], sys.argv[2]
    placement = sys.argv[3] if len(sys.argv) > 3 else "node"
    placement = None if placement == "local" else stoker.Node(workers=2)
    rank = int(os.environ["RANK"])
    torch.manual_seed(0)
    out = {"rank": rank, "epochs": [], "pool": None, "deaths": []}
    calls = os.environ.get("CALLS")
    ds = Values(calls=calls, slow_s=0.02 if scenario.startswith("kill") else 0.0)
    if scenario == "shards":  # each rank's own dataset (another group each), slow samples
        ds = Counted(os.environ["TRACK"], offset=1000 * rank)
    if scenario == "tp_shared":  # a pair whose dataset holds a SharedList each built
        ds = WithList(calls=calls)
    if scenario == "prints":  # each rank's own dataset, printing from the pool's workers
        ds = Prints(rank)
    if scenario == "tp":  # a tensor-parallel pair: both ranks ask for the same batches
        import torch.distributed as dist

        dist.init_process_group("gloo")
        dl, sampler = loader(ds, placement, replicas=1, rank=0)
    elif scenario in ("tp_apart", "tp_shared"):  # a pair, not in step: rank 1 dawdles
        dl, sampler = loader(ds, placement, replicas=1, rank=0)
    else:
        dl, sampler = loader(ds, placement)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        got = []
        for step, b in enumerate(dl):
            got.append((b["index"].tolist(), b["x"].tolist()))
            if step == 0 and out["pool"] is None:
                out["pool"] = dl.stats().get("pool")
                if out["pool"]:
                    out["pool_uid"] = os.stat(f"/proc/{out['pool']['pid']}").st_uid
                    with open(f"/proc/{out['pool']['pid']}/smaps_rollup") as f:
                        private = [int(line.split()[1]) for line in f
                                   if line.startswith(("Private_Clean:", "Private_Dirty:"))]
                    out["pool_own_kb"] = sum(private)  # what it holds that it shares with none
            if scenario == "tp":
                dist.barrier()
            if scenario in ("tp_apart", "tp_shared") and rank == 1:
                time.sleep(0.15)
            if step == 1 and epoch == 0:  # who each of this rank's workers is, by pid
                out["worker_pids"] = [w["pid"] for w in dl.stats()["workers"]]
                out["pool_now"] = dl.stats().get("pool")
            if epoch == 0 and step == 1:
                if scenario == "kill_worker" and rank == 0:
                    os.kill(out["pool"]["pids"][0], signal.SIGKILL)
                elif scenario == "kill_pool" and rank == 0:
                    os.kill(out["pool"]["pid"], signal.SIGKILL)
                elif scenario == "kill_template" and rank == 0:
                    # the pool's template first (its workers go on), then a worker: its
                    # replacement comes from a fork server
                    with open(f"/proc/{out['pool']['pid']}/task/{out['pool']['pid']}/children") as f:
                        kids = [int(p) for p in f.read().split()]
                    for kid in kids:
                        with open(f"/proc/{kid}/comm") as f:
                            if f.read().strip() == "stoker-template":
                                os.kill(kid, signal.SIGKILL)
                                out["template_killed"] = kid
                    time.sleep(0.2)
                    os.kill(dl.stats()["pool"]["pids"][0], signal.SIGKILL)
                elif scenario == "kill_self" and rank == 1:
                    os.kill(os.getpid(), signal.SIGKILL)
                elif scenario == "hold":
                    _write(f"{report}.{rank}.json", out)
                    time.sleep(600)
        out["epochs"].append(got)
    out["deaths"] = [d.get("cause") for d in dl.stats().get("deaths", [])]
    _write(f"{report}.{rank}.json", out)


if __name__ == "__main__":
    main()
