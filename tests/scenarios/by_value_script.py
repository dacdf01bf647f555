"""A training script as people write them, run as ``python by_value_script.py CONTEXT...``
(tests/pickling/test_by_value.py): a top-level sample class and module state; closures (a worker_init_fn,
a collate_fn that reads the dataset) sharing a variable, a namedtuple, a shared-memory tensor,
an mp.Value and an mp.Queue; under the main guard a module import, an open file and a function
that uses them. Each loader runs under each start method named;
prints one JSON line: what each gave (fork's is what the others must give)."""

import collections
import json
import multiprocessing as mp
import sys

import torch

import stoker

STATE = {"worker": None}  # module state the worker's own run of this script has too


class Item:
    def __init__(self, i):
        self.i = i


class Numbers(torch.utils.data.Dataset):
    tag = "set in the main process"

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return Item(i), str(STATE["worker"])


def top_level_init(worker_id):
    STATE["worker"] = f"w{worker_id}"


def run(ctx: str, root) -> dict:
    ds = Numbers()
    Cfg = collections.namedtuple("Cfg", "scale")  # made under the guard: no class statement
    ds.cfg = Cfg(10)
    counts = torch.zeros(2, dtype=torch.int64).share_memory_()
    value = mp.get_context(ctx).Value("i", 0)
    queue = mp.get_context(ctx).Queue()

    last = None  # a variable init sets and collate reads: one cell, shared in the worker too

    def init(worker_id):  # a closure: goes by value
        nonlocal last
        last = f"init ran in w{worker_id}"
        STATE["worker"] = f"w{worker_id}"
        info = torch.utils.data.get_worker_info()
        info.dataset.tag = "set in the worker"
        counts[worker_id] += 41
        with value.get_lock():
            value.value += 7
        queue.put(f"hello from worker {worker_id}")

    def collate(batch):  # reads the dataset the worker has, and the script's own class
        return [(isinstance(item, Item), item.i * ds.cfg.scale, state, ds.tag, last,
                 root(item.i)) for item, state in batch]

    out = {}
    for name, fn in (("guarded", init), ("top_level", top_level_init)):
        dl = stoker.DataLoader(ds, batch_size=2, num_workers=1, multiprocessing_context=ctx,
                               worker_init_fn=fn, collate_fn=collate)
        out[name] = list(dl)
    out["shared_tensor"] = counts.tolist()
    out["value"] = value.value
    out["queue"] = queue.get(timeout=30)
    return out


if __name__ == "__main__":
    import math  # imported under the guard: the worker's run of the script lacks it

    log = open(__file__)  # a guard-level name that is also an attribute below (torch.log)

    def root(x):  # defined under the guard, using what only the guard binds
        return round(math.sqrt(x) + torch.log(torch.tensor(1.0)).item(), 3)

    print(json.dumps({ctx: run(ctx, root) for ctx in sys.argv[1:]}))
    log.close()
