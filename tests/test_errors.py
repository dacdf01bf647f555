"""Bad input gets a clear error in the main process: never a hang, never a crash."""

from __future__ import annotations

import pytest

SETUP = """
import os, signal, sys, torch, stoker
from scenario_datasets import *
"""


def test_exception_in_getitem_keeps_type_index_and_traceback(script):
    r = script(SETUP + """
loader = stoker.DataLoader(RaisesAt(13), batch_size=4, num_workers=2)
try:
    for _ in loader:
        pass
except ValueError as e:
    msg = str(e)
    assert "dataset index 13" in msg, msg
    assert "cannot decode sample 13: corrupt file" in msg, msg
    assert "Traceback (most recent call last)" in msg and "__getitem__" in msg, msg
    assert "worker process" in msg, msg
    print("OK")
""")
    assert "OK" in r.stdout, r.stderr


def test_keyerror_in_getitem_stays_keyerror(script):
    r = script(SETUP + """
loader = stoker.DataLoader(RaisesAt(2, exc=KeyError), batch_size=2, num_workers=1)
try:
    list(loader)
except KeyError as e:
    assert "dataset index 2" in str(e)
    print("OK")
""")
    assert "OK" in r.stdout, r.stderr


def test_samples_that_do_not_stack_name_index_field_and_shapes(script):
    r = script(SETUP + """
loader = stoker.DataLoader(RaggedAt(6), batch_size=4, num_workers=2)
try:
    list(loader)
except RuntimeError as e:
    msg = str(e)
    assert isinstance(e, stoker.CollateError), type(e)
    assert "['image']" in msg, msg
    assert "dataset index 6" in msg and "dataset index 4" in msg, msg
    assert "[3, 4, 4]" in msg and "[3, 5, 4]" in msg, msg
    print("OK")
""")
    assert "OK" in r.stdout, r.stderr


def test_unpicklable_batch_names_its_type_instead_of_hanging(script):
    r = script(SETUP + """
loader = stoker.DataLoader(Squares(), batch_size=4, num_workers=2, collate_fn=collate_with_lock)
try:
    next(iter(loader))
except TypeError as e:
    msg = str(e)
    assert "Unpicklable" in msg and "lock" in msg, msg
    print("OK")
""", timeout=60)
    assert "OK" in r.stdout, r.stderr


@pytest.mark.parametrize("signame", ["SIGKILL", "SIGSEGV", "SIGBUS"])
def test_worker_killed_by_signal_is_named(script, signame):
    r = script(SETUP + f"""
loader = stoker.DataLoader(KillsSelfAt(9, signal.{signame}), batch_size=4, num_workers=2)
try:
    list(loader)
except stoker.WorkerCrashed as e:
    assert e.signal == "{signame}", e.signal
    assert e.pid and str(e.pid) in str(e), str(e)
    assert "worker" in str(e) and "{signame}" in str(e), str(e)
    assert e.worker_id in (0, 1)
    print("OK")
""")
    assert "OK" in r.stdout, r.stderr


def test_worker_exit_code_is_named(script):
    r = script(SETUP + """
loader = stoker.DataLoader(ExitsAt(5, code=3), batch_size=2, num_workers=2)
try:
    list(loader)
except stoker.WorkerCrashed as e:
    assert e.exit_code == 3 and e.signal is None, (e.exit_code, e.signal)
    assert "exited with code 3" in str(e), str(e)
    print("OK")
""")
    assert "OK" in r.stdout, r.stderr


def test_no_worker_or_fd_survives_errors(script):
    r = script(SETUP + """
import multiprocessing as mp
def fds(): return len(os.listdir('/proc/self/fd'))
before = fds()
for ds in (RaisesAt(3), KillsSelfAt(3), RaggedAt(3)):
    try:
        list(stoker.DataLoader(ds, batch_size=2, num_workers=2))
    except Exception:
        pass
import gc; gc.collect()
kids = [p for p in os.listdir('/proc') if p.isdigit() and open(f'/proc/{p}/stat').read().split()[3] == str(os.getpid())]
assert not kids, kids
assert fds() == before, (before, fds())
print("OK")
""")
    assert "OK" in r.stdout, r.stderr


@pytest.mark.parametrize(
    "kwargs, exc",
    [
        ({"num_workers": -1}, ValueError),
        ({"timeout": -1}, ValueError),
        ({"prefetch_factor": 2}, ValueError),
        ({"persistent_workers": True}, ValueError),
        ({"shuffle": True, "sampler": [0, 1]}, ValueError),
        ({"batch_sampler": [[0]], "batch_size": 2}, ValueError),
        ({"num_workers": 1, "multiprocessing_context": "nonsense"}, ValueError),
        ({"num_workers": 1, "multiprocessing_context": 42}, TypeError),
    ],
)
def test_invalid_arguments_raise_what_torch_raises(kwargs, exc):
    import torch

    import stoker
    from scenario_datasets import Squares

    with pytest.raises(exc) as theirs:
        torch.utils.data.DataLoader(Squares(), **kwargs)
    with pytest.raises(exc) as ours:
        stoker.DataLoader(Squares(), **kwargs)
    assert str(ours.value) == str(theirs.value)


def test_slot_rewritten_before_it_was_read_is_named(script):
    r = script("""
import time, torch, stoker
from scenario_datasets import RewritesReadySlots
loader = stoker.DataLoader(RewritesReadySlots(at=8, n=64), batch_size=4, num_workers=1)
try:
    for batch in loader:
        time.sleep(0.2)  # the worker, ahead, loads the next samples while a batch waits
except stoker.CorruptBatchError as e:
    msg = str(e)
    assert "written again before it was read" in msg and "generation" in msg, msg
    assert "state 'ready')" not in msg.split("(it holds")[0], msg
    print("OK")
""", timeout=60)
    assert "OK" in r.stdout, r.stdout + r.stderr
