"""Shared memory held by the user is bounded by what they hold, and max_shared_memory caps it.

Small arrays are copied out of the slot, so a lent slot is always pinned by a view of at least
1/VIEW_SLOT_DIVISOR of its bytes: slot bytes held <= VIEW_SLOT_DIVISOR * bytes of tensors held.
"""

from __future__ import annotations

import pytest

_BOUND = """
import torch, stoker
from stoker import _stoker
K = _stoker.VIEW_SLOT_DIVISOR
def held_bytes(ts):
    return sum(t.untyped_storage().nbytes() for t in ts)
def check_bound(loader, held, what):
    mem = loader.stats()["memory"]
    pinned, h = mem["bytes_held_by_user"], held_bytes(held)
    print(what, "pinned", pinned, "held", h, "slots", mem["slots_held_by_user"])
    assert pinned <= K * h, (what, pinned, h, mem)
    return mem
"""


def test_keeping_only_labels_pins_no_slot(script):
    r = script(_BOUND + """
from scenario_datasets import Squares
# 32 x 3x64x64 uint8 images (384 KiB, views) and 32 int labels (256 B, copies) per batch
class Images(Squares):
    def __getitem__(self, i):
        return torch.full((3, 64, 64), i % 251, dtype=torch.uint8), i
loader = stoker.DataLoader(Images(n=32 * 400), batch_size=32, num_workers=2)
it = iter(loader)
labels = []
for n in range(200):
    images, label = next(it)
    assert images.untyped_storage().nbytes() >= _stoker.VIEW_MIN_BYTES
    labels.append(label)
    del images, label
check_bound(loader, labels, "labels only")
for n in range(50):  # later batches reuse the slots: the labels kept their values
    next(it)
assert all(int(l[k]) == 32 * i + k for i, l in enumerate(labels) for k in range(32))
print("OK")
""", timeout=180)
    assert "OK" in r.stdout, r.stdout + r.stderr


def test_holding_1000_tiny_batches_pins_no_slot(script):
    r = script(_BOUND + """
from scenario_datasets import Squares
loader = stoker.DataLoader(Squares(n=4 * 1200, shape=(4,)), batch_size=4, num_workers=2)
it = iter(loader)
held = [next(it) for _ in range(1000)]
mem = check_bound(loader, [t for b in held for t in b], "1000 tiny batches")
assert mem["slots_held_by_user"] == 0, mem
for n in range(100):
    next(it)
assert all(float(b[0][k, 0]) == 4 * i + k and int(b[1][k]) == 4 * i + k
           for i, b in enumerate(held) for k in range(4))
print("OK")
""", timeout=180)
    assert "OK" in r.stdout, r.stdout + r.stderr


def test_large_tensors_stay_views_and_medium_ones_do_not_pin_the_slot(script):
    r = script(_BOUND + """
from torch.utils.data import Dataset
class TwoSizes(Dataset):  # per batch of 8: 'big' 1 MiB, 'medium' 128 KiB (< slot / K)
    def __len__(self): return 8 * 200
    def __getitem__(self, i):
        return {"big": torch.full((32 * 1024,), float(i)), "medium": torch.full((2048,), -i)}
loader = stoker.DataLoader(TwoSizes(), batch_size=8, num_workers=2)
it = iter(loader)
mediums = [next(it)["medium"] for _ in range(60)]
check_bound(loader, mediums, "medium fields only")
bigs = [next(it)["big"] for _ in range(10)]
mem = check_bound(loader, mediums + bigs, "and 10 big fields")
assert mem["slots_held_by_user"] == 10, mem  # each big field is a view of its batch's slot
assert all(int(m[k, 0]) == -(8 * i + k) for i, m in enumerate(mediums) for k in range(8))
assert all(float(b[k, 0]) == 8 * (60 + i) + k for i, b in enumerate(bigs) for k in range(8))
print("OK")
""", timeout=180)
    assert "OK" in r.stdout, r.stdout + r.stderr


# 1 MiB batches; 8 MiB split between 2 workers leaves each room for 3 slots.
_CAPPED = """
import time, torch, stoker
from stoker.engine import worker as _loop
from scenario_datasets import Squares
_loop.SHARED_MEMORY_PATIENCE_S = {patience}
CAP = 8 << 20
loader = stoker.DataLoader(Squares(n=4 * 60, shape=(64 * 1024,)), batch_size=4, num_workers=2,
                           max_shared_memory=CAP, multiprocessing_context="fork")
it = iter(loader)
"""


def test_holding_batches_beyond_the_cap_fails_with_what_is_held(script):
    r = script(_CAPPED.format(patience=1.0) + """
held = []
try:
    for b in it:
        held.append(b)
        assert loader.stats()["memory"]["bytes_mapped"] <= CAP
except stoker.SharedMemoryLimitError as e:
    assert isinstance(e, MemoryError)
    print("HELD", len(held))
    print("MESSAGE", e)
else:
    raise AssertionError("holding every batch never hit the cap")
""", timeout=120)
    out = r.stdout + r.stderr
    assert "MESSAGE" in r.stdout, out
    held = int(r.stdout.split("HELD ")[1].split()[0])
    assert 2 <= held <= 6, out
    message = r.stdout.split("MESSAGE ", 1)[1]
    for part in ("max_shared_memory", "still held by your code", f"your code holds {held} batch",
                 "Drop references", "prefetch_factor"):
        assert part in message, message


def test_workers_wait_for_the_user_and_resume_when_batches_are_dropped(script):
    r = script(_CAPPED.format(patience=60.0) + """
held = [next(it) for _ in range(6)]  # every slot of both workers is now held
time.sleep(2.0)  # the workers wait for room (not an error: patience is 60 s)
assert loader.stats()["memory"]["bytes_mapped"] <= CAP
first = [float(b[0][k, 0]) for b in held for k in range(4)]
held.clear()
rest = []
for b in it:
    rest.append(float(b[0][0, 0]))
    assert loader.stats()["memory"]["bytes_mapped"] <= CAP
    del b
assert first == [float(i) for i in range(24)], first
assert rest == [float(4 * i) for i in range(6, 60)], rest
print("OK")
""", timeout=120)
    assert "OK" in r.stdout, r.stdout + r.stderr


def test_max_shared_memory_values():
    import stoker
    from stoker import _system
    from stoker.config.options import shared_memory_cap

    ds = list(range(8))
    assert stoker.DataLoader(ds, max_shared_memory=1 << 30).options.shared_memory_cap() \
        == 1 << 30
    assert stoker.DataLoader(ds, max_shared_memory=None).options.shared_memory_cap() is None
    for bad in (0, -1, 1.5, "4GiB", True):
        with pytest.raises(ValueError, match="max_shared_memory"):
            stoker.DataLoader(ds, max_shared_memory=bad)
    real = _system.memory_limit_and_usage
    try:
        _system.memory_limit_and_usage = lambda: (8 << 30, 1 << 30)
        assert shared_memory_cap("auto") == 4 << 30
        _system.memory_limit_and_usage = lambda: (None, None)
        assert shared_memory_cap("auto") is None
    finally:
        _system.memory_limit_and_usage = real


def test_num_workers_auto_divides_the_cap_among_the_workers_running(script):
    """num_workers="auto" starts one of two workers; the cap is divided among the workers
    running, not the most there may be: a loop that keeps its last two 4 MiB batches under a
    24 MiB cap completes (it used to wait out its patience and fail), and the tuner adds no
    worker that would leave each one less than its batches take."""
    r = script("""
import collections, stoker
from stoker import _system
from stoker.engine import worker as _loop
from scenario_datasets import Squares
_system.usable_cpus = lambda: 2
_loop.SHARED_MEMORY_PATIENCE_S = 5.0
CAP = 24 << 20
loader = stoker.DataLoader(Squares(n=60, shape=(1 << 20,)), batch_size=1, num_workers="auto",
                           max_shared_memory=CAP)
last, peak, seen = collections.deque(maxlen=2), 0, []
for b in loader:
    last.append(b)
    seen.append(int(b[1][0]))
    peak = max(peak, loader.stats()["memory"]["bytes_mapped"])
assert seen == list(range(60)), seen
assert peak <= CAP, peak
print("OK", peak >> 20)
""", timeout=120)
    assert "OK" in r.stdout, r.stdout + r.stderr


def test_a_worker_added_takes_its_share_from_the_others(script):
    """A tuner that adds a worker (scripted): the running one is told its smaller share and
    lets go of free slots at once; every batch arrives and the slots never exceed the cap."""
    r = script("""
import itertools, stoker
from stoker import _system
from stoker.autotune import measure, tuner
from scenario_datasets import Squares
_system.usable_cpus = lambda: 2
measure.WINDOW_S = 0.0
steps = itertools.chain([1] * 10, itertools.repeat(2))
def decide(self, window, batch):
    self.active = next(steps)
    return self.active
tuner.Tuner.decide = decide
CAP = 48 << 20
loader = stoker.DataLoader(Squares(n=80, shape=(1 << 20,)), batch_size=1, num_workers="auto",
                           max_shared_memory=CAP)
seen, peak = [], 0
for b in loader:
    seen.append(int(b[1][0]))
    peak = max(peak, loader.stats()["memory"]["bytes_mapped"])
    del b
assert seen == list(range(80)), seen
assert peak <= CAP, peak
assert loader.stats()["autotune"]["active_workers"] == 2
print("OK")
""", timeout=120)
    assert "OK" in r.stdout, r.stdout + r.stderr
