"""Threads and forks that are not workers: a child forked from the main process frees nothing the
main process uses and keeps none of the loader's slots or descriptors; workers started from a
thread outlive that thread."""

from __future__ import annotations

import pytest

# The child forked from a process with a live iterator and a held batch reports what it still
# maps and holds; the parent then finishes the epoch holding every batch and checks them all.
_FORK_CHILD = """
import gc, os, weakref
import stoker
from scenario_datasets import Squares

N = 400
# 64 KiB samples: batches stay zero-copy views of their slot (small ones would be copied)
loader = stoker.DataLoader(Squares(N, shape=(16, 1024)), batch_size=4, num_workers=1, prefetch_factor=2,
                           multiprocessing_context="fork")
it = iter(loader)
gc.disable()            # the parent collects nothing until the end: garbage keeps its lease
held = next(it)
first = held[1].tolist()
ref = weakref.ref(held[0])
{make_garbage}
mine = {{os.readlink(f"/proc/self/fd/{{fd}}") for fd in it.workers.owned_fds()}}
sockets = {{t for t in mine if t.startswith("socket:")}}
assert len(sockets) == 1, mine

def slot_maps():
    return [l for l in open("/proc/self/maps") if "stoker-w" in l and "-slot" in l]

def report(tag):
    fds = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds.add(os.readlink(f"/proc/self/fd/{{fd}}"))
        except OSError:
            pass
    engine = sorted(t for t in fds if t in sockets or "pidfd" in t or "stoker-status" in t
                    or "stoker-stderr" in t or "stoker-crash" in t)
    return f"{{tag}} slots={{len(slot_maps())}} engine_fds={{engine}}"

r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    lines = [report("before")]
    {drop_in_child}
    gc.collect()
    lines.append(report("after"))
    os.write(w, ("\\n".join(lines) + "\\n").encode())
    os._exit(0)
os.close(w)
child = b""
while chunk := os.read(r, 65536):
    child += chunk
os.waitpid(pid, 0)
print(child.decode(), end="")

kept = []
seen = list(first)
for x, y in it:           # the rest of the epoch, every batch kept (the pool grows)
    kept.append((x, y))
    seen += y.tolist()
held_now = ref()
assert held_now is not None
assert held_now.flatten(1)[:, 0].tolist() == [float(i) for i in first], first
for x, y in kept:
    assert x.flatten(1)[:, 0].tolist() == [float(i) for i in y.tolist()], y.tolist()
assert sorted(seen) == list(range(N)), "samples lost or duplicated"
print("OK")
"""


@pytest.mark.parametrize("garbage", [False, True], ids=["held", "cyclic-garbage"])
def test_forked_child_frees_no_slot_and_keeps_no_engine_resource(script, garbage):
    if garbage:
        make_garbage = (
            "class Holder:\n    pass\nh = Holder(); h.me = h; h.batch = held\ndel h, held"
        )
        drop_in_child = "pass  # the batch is cyclic garbage: gc.collect() frees it"
    else:
        make_garbage = ""
        drop_in_child = "del held"
    r = script(
        _FORK_CHILD.format(make_garbage=make_garbage, drop_in_child=drop_in_child), timeout=120
    )
    assert "OK" in r.stdout, r.stdout + r.stderr
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines() if " slots=" in line)
    # Right after the fork the child maps only the held batch's slot, holds no engine fd...
    assert lines["before"] == "slots=1 engine_fds=[]", r.stdout
    # ... and nothing once its copy of the batch is gone.
    assert lines["after"] == "slots=0 engine_fds=[]", r.stdout


def test_workers_started_from_a_thread_outlive_it(script):
    r = script("""
import os, threading
import stoker
from scenario_datasets import Squares

def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

loader = stoker.DataLoader(Squares(64), batch_size=4, num_workers=2, persistent_workers=True,
                           multiprocessing_context="fork")
first = []
t = threading.Thread(target=lambda: first.extend(y.tolist() for _, y in loader))
t.start()
t.join()
assert sorted(sum(first, [])) == list(range(64))
pids = [p.pid for p in loader._iterator._workers]
second = []
for x, y in loader:       # same persistent workers, iterated from the main thread
    assert x[:, 0].tolist() == [float(i) for i in y.tolist()]
    second += y.tolist()
assert sorted(second) == list(range(64)), second
assert [p.pid for p in loader._iterator._workers] == pids, "workers were restarted"
assert all(alive(p) for p in pids), [alive(p) for p in pids]
print("OK")
""", timeout=120)
    assert "OK" in r.stdout, r.stdout + r.stderr


def test_no_sequence_of_forks_gc_and_restarts_loses_or_repeats_a_sample(script):
    # Batches held in cyclic garbage, an exception kept in a local, a helper process forked every
    # 10 batches that collects garbage, workers killed and restarted (by fork, so each new worker
    # inherits every live lease), and a garbage collector that runs all the time.
    r = script("""
import gc, os, tempfile, sys
import torch, stoker
from scenario_datasets import KillsOnceAt
gc.set_threshold(5, 2, 2)
marks = tempfile.mkdtemp()
ds = KillsOnceAt(bad=[7, 30, 31, 90, 150], marks=marks, n=200)
ds.shape = (16, 1024)   # 64 KiB samples: batches are zero-copy views of their slots
loader = stoker.DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="fork")
seen, kept = [], []
class Cycle:
    pass
for i, (x, y) in enumerate(loader):
    assert x.flatten(1)[:, 0].tolist() == [float(v) for v in y.tolist()], (i, y.tolist())
    seen += y.tolist()
    c = Cycle(); c.me = c; c.batch = (x, y)   # garbage with a lease, collected at random
    del c
    if i % 3 == 0:
        kept.append((x, y))
    try:
        raise ValueError(i)
    except ValueError as e:
        err = e  # keeps a frame (and the batch) alive through its traceback
    if i % 10 == 0:
        pid = os.fork()
        if pid == 0:
            gc.collect()
            os._exit(0)
        os.waitpid(pid, 0)
for x, y in kept:
    assert x.flatten(1)[:, 0].tolist() == [float(v) for v in y.tolist()], y.tolist()
assert sorted(seen) == list(range(200)), "samples lost or duplicated"
assert len(loader.deaths) == 5, loader.deaths
print("OK")
""", timeout=180)
    assert "OK" in r.stdout, r.stdout + r.stderr
