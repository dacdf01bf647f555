"""stoker.SharedList: a flat, read-only list whose pages workers share."""

from __future__ import annotations

import pickle

import pytest

import stoker


def test_items_round_trip_and_behave_like_a_sequence():
    items = [{"path": "/d/7.jpg", "label": 1}, None, 3.5, "x" * 1000, (1, [2, 3])]
    sl = stoker.SharedList(items)
    assert len(sl) == 5 and list(sl) == items and sl[-1] == (1, [2, 3]) and sl[1:3] == [None, 3.5]
    with pytest.raises(IndexError):
        sl[5]
    assert stoker.SharedList([]).__len__() == 0


def test_spawned_workers_map_the_same_memory(script):
    r = script("""
import os, torch, stoker
from scenario_datasets import Lookup
loader = stoker.DataLoader(Lookup(), batch_size=10, num_workers=2, multiprocessing_context="spawn")
out = [b for b in loader]
assert [int(x) for b in out for x in b[0]] == [i * 97 for i in range(100)]
assert all(bool(x) for b in out for x in b[1])   # mapped, not unpickled into a copy
print("OK")
""", timeout=120)
    assert "OK" in r.stdout, r.stdout + r.stderr


def test_reading_does_not_grow_a_forked_workers_memory(script):
    r = script("""
import os, gc, stoker
items = stoker.SharedList({"path": f"/data/{i:07d}.jpg", "label": i} for i in range(300_000))
gc.freeze()
def private_kb():
    return sum(int(l.split()[1]) for l in open('/proc/self/smaps_rollup')
               if l.startswith(('Private_Dirty', 'Private_Clean')))
pid = os.fork()
if pid == 0:
    before = private_kb()
    total = sum(items[i]["label"] for i in range(0, len(items), 7))
    grown = private_kb() - before
    os._exit(0 if grown < 20_000 else 1)   # far less than the ~30 MB of the list itself
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0
print("OK", items.nbytes)
""", timeout=120)
    assert "OK" in r.stdout, r.stdout + r.stderr


def test_pickling_outside_a_worker_start_still_works():
    sl = stoker.SharedList([1, 2, 3])
    assert list(pickle.loads(pickle.dumps(sl))) == [1, 2, 3]
