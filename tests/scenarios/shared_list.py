"""Scenarios of tests/datasets/test_shared_list.py: SharedList's pages shared with spawned workers and
with a forked child, each in a fresh process."""

from __future__ import annotations

import gc
import os

import stoker
from scenario_datasets import Lookup
from scenarios.probes import private_kb


def spawned_workers_map_the_same_memory():
    """Spawned workers read a SharedList by mapping its pages, not an unpickled copy."""
    loader = stoker.DataLoader(Lookup(), batch_size=10, num_workers=2,
                               multiprocessing_context="spawn")
    out = [b for b in loader]
    assert [int(x) for b in out for x in b[0]] == [i * 97 for i in range(100)]
    assert all(bool(x) for b in out for x in b[1])   # mapped, not unpickled into a copy


def reading_does_not_grow_a_forked_child():
    """A forked child reading a 300,000-item SharedList grows its private memory < 20 MB."""
    items = stoker.SharedList({"path": f"/data/{i:07d}.jpg", "label": i} for i in range(300_000))
    gc.freeze()
    pid = os.fork()
    if pid == 0:
        before = private_kb()
        sum(items[i]["label"] for i in range(0, len(items), 7))
        grown = private_kb() - before
        os._exit(0 if grown < 20_000 else 1)   # far less than the ~30 MB of the list itself
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    print("NBYTES", items.nbytes)
