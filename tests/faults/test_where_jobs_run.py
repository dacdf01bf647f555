"""Settings real training jobs create: other threads, stopped or stuck workers, dropped
iterators, redirected output, the user's gc.freeze(), indices that are not ints."""

from __future__ import annotations

from .test_worker_deaths import SETUP


def test_stats_from_another_thread_while_iterating(script):
    # A Prometheus exporter or a monitoring thread calls stats() at any moment, including while
    # the iterator starts its workers and while the loop waits inside the engine.
    r = script(SETUP + """
import threading
loader = stoker.DataLoader(Slow(400), batch_size=2, num_workers=2, persistent_workers=True)
errors, calls = [], [0]
stop = threading.Event()
def watch():
    while not stop.is_set():
        try:
            s = loader.stats()
            assert isinstance(s["workers"], list) and "memory" in s
            calls[0] += 1
        except Exception as e:
            errors.append(repr(e))
t = threading.Thread(target=watch, daemon=True)
t.start()
for epoch in range(2):
    got = list(loader)
    assert labels(got) == list(range(400)), epoch
stop.set(); t.join()
assert not errors, errors[:3]
assert calls[0] > 50, calls
print("OK")
""", timeout=120)
    assert "OK" in r.stdout, r.stdout + r.stderr


def test_worker_output_is_flushed_and_exits_are_quiet(script, tmp_path):
    # Worker prints reach a redirected stdout (block-buffered), and neither the end of an epoch
    # nor an iterator dropped mid-epoch prints anything on stderr.
    out = tmp_path / "out.txt"
    r = script(f"""
import sys
sys.stdout = open({str(out)!r}, "w")
import os
os.dup2(sys.stdout.fileno(), 1)
import torch, stoker
from torch.utils.data import Dataset
class Prints(Dataset):
    def __init__(self, word): self.word = word
    def __len__(self): return 8
    def __getitem__(self, i):
        print(self.word, i)
        return i
list(stoker.DataLoader(Prints("sample"), batch_size=2, num_workers=2))
it = iter(stoker.DataLoader(Prints("dropped"), batch_size=1, num_workers=2, prefetch_factor=4))
next(it)
del it
import gc; gc.collect()
sys.stderr.write("DONE\\n")
""", timeout=60)
    assert r.stderr.strip().endswith("DONE"), r.stderr
    assert "Traceback" not in r.stderr and "Error" not in r.stderr, r.stderr
    lines = out.read_text().splitlines()
    assert sorted(x for x in lines if x.startswith("sample")) == sorted(
        f"sample {i}" for i in range(8)), lines


def test_users_gc_freeze_is_kept(script):
    r = script(SETUP + """
import gc
junk = [[i] for i in range(20000)]
gc.freeze()
frozen = gc.get_freeze_count()
assert frozen > 10000
for ctx in ("fork", "spawn"):
    got = list(stoker.DataLoader(Squares(16), batch_size=4, num_workers=2,
                                 multiprocessing_context=ctx))
    assert labels(got) == list(range(16))
    # (objects freed since leave the frozen generation: a few hundred, not all of them)
    assert gc.get_freeze_count() > frozen * 0.9, (ctx, frozen, gc.get_freeze_count())
print("OK")
""", timeout=90)
    assert "OK" in r.stdout, r.stdout + r.stderr


def test_sigstopped_idle_worker_is_named_and_restarted_with_hang_timeout(script):
    # A worker stopped (SIGSTOP: a debugger, a cgroup freezer) while idle never takes the tasks
    # queued to it. With hang_timeout it is killed, restarted and its work re-issued.
    r = script(SETUP + """
import time, logging
logging.basicConfig()
loader = stoker.DataLoader(Squares(64), batch_size=4, num_workers=2, hang_timeout=2,
                           persistent_workers=True)
assert labels(list(loader)) == list(range(64))   # workers are idle now
os.kill(loader._iterator._workers[1].pid, signal.SIGSTOP)
t = time.monotonic()
got = list(loader)
assert labels(got) == list(range(64)), labels(got)
assert time.monotonic() - t < 30
d = loader.deaths[-1]
assert d.worker_id == 1 and "did not take its queued work" in d.cause, d
print("OK")
""", timeout=90)
    assert "OK" in r.stdout, r.stdout + r.stderr
    assert "stopped (state T" in r.stderr, r.stderr


def test_sigstopped_worker_without_hang_timeout_is_named_in_log_and_stats(script):
    r = script(SETUP + """
import time, logging
logging.basicConfig()
loader = stoker.DataLoader(Squares(64), batch_size=4, num_workers=2, timeout=8,
                           persistent_workers=True)
list(loader)
victim = loader._iterator._workers[0].pid
os.kill(victim, signal.SIGSTOP)
seen = []
import threading
def watch():
    for _ in range(100):
        for w in loader.stats()["workers"]:
            if "stuck" in w:
                seen.append(w["stuck"]); return
        time.sleep(0.1)
th = threading.Thread(target=watch); th.start()
try:
    list(loader)
except stoker.WorkerHung as e:
    assert "stopped (state T" in str(e), str(e)
    th.join()
    assert seen and "stopped" in seen[0], seen
    os.kill(victim, signal.SIGCONT)
    print("OK")
""", timeout=90)
    assert "OK" in r.stdout, r.stdout + r.stderr
    assert r.stderr.count("without starting them") == 1, r.stderr


def test_forking_with_other_threads_warns_once_naming_them(script):
    r = script(SETUP + """
import threading, warnings
ev = threading.Event()
t = threading.Thread(target=ev.wait, name="metrics-pusher", daemon=True); t.start()
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    list(stoker.DataLoader(Squares(8), batch_size=2, num_workers=2,
                           multiprocessing_context="fork"))
msgs = [str(x.message) for x in w if "other threads" in str(x.message)]
assert len(msgs) == 1 and "metrics-pusher" in msgs[0] and "forkserver" in msgs[0], msgs
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    list(stoker.DataLoader(Squares(8), batch_size=2, num_workers=2,
                           multiprocessing_context="forkserver"))
assert not [x for x in w if "other threads" in str(x.message)]
ev.set()
print("OK")
""", timeout=90)
    assert "OK" in r.stdout, r.stdout + r.stderr


def test_quarantine_names_indices_that_are_not_python_ints(script):
    r = script(SETUP + """
import numpy as np
from torch.utils.data import Sampler
class NpSampler(Sampler):
    def __init__(self, n): self.n = n
    def __len__(self): return self.n
    def __iter__(self): return (np.int64(i) for i in range(self.n))
loader = stoker.DataLoader(KillsSelfAt(9, signal.SIGSEGV, n=32), batch_size=4, num_workers=2,
                           sampler=NpSampler(32), on_error="skip")
got = list(loader)
assert labels(got) == [i for i in range(32) if i != 9], labels(got)
assert [int(s.index) for s in loader.skipped] == [9], loader.skipped
assert len(loader.deaths) == 2
print("OK")
""", timeout=90)
    assert "OK" in r.stdout, r.stdout + r.stderr


def test_quarantine_counts_do_not_add_up_across_epochs(script):
    # One death at index 5 in each of two epochs (say, unrelated kills): nothing is poisoned.
    r = script(SETUP + """
marks = tempfile.mkdtemp()
loader = stoker.DataLoader(KillsOnceAt(bad=[5], marks=marks, n=16), batch_size=2,
                           num_workers=2, persistent_workers=True)
assert labels(list(loader)) == list(range(16))
import shutil; shutil.rmtree(marks); os.makedirs(marks)
assert labels(list(loader)) == list(range(16))
assert len(loader.deaths) == 2 and not loader.skipped and not loader.stats()["quarantined"]
print("OK")
""", timeout=90)
    assert "OK" in r.stdout, r.stdout + r.stderr


def test_killed_while_starting_is_not_blamed_on_pickling(script):
    # Killed from outside while it unpickles its dataset (before it reports anything): the
    # message says so, instead of blaming pickling.
    r = script(SETUP + """
import threading, time
loader = stoker.DataLoader(SlowToUnpickle(8), batch_size=2, num_workers=1,
                           multiprocessing_context="spawn")
it = iter(loader)
def kill():
    time.sleep(3)
    os.kill(it._workers[0].pid, signal.SIGKILL)
threading.Thread(target=kill, daemon=True).start()
try:
    next(it)
except stoker.WorkerCrashed as e:
    assert "pickl" not in str(e) and "SIGKILL" in str(e) and "while starting" in str(e), str(e)
    print("OK")
""", timeout=60)
    assert "OK" in r.stdout, r.stdout + r.stderr


def test_typing_alias_workers_list_and_forkserver_pickle_warning(script):
    r = script(SETUP + """
import warnings
from typing import List
alias = stoker.DataLoader[List[int]]
assert alias.__origin__ is stoker.DataLoader
it = iter(stoker.DataLoader(Squares(8), batch_size=2, num_workers=2))
ws = it._workers
assert len(ws) == 2 and all(w.pid > 0 and w.is_alive() for w in ws)
list(it)
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    try:
        list(stoker.DataLoader(Squares(8), batch_size=2, num_workers=1,
                               worker_init_fn=lambda i: None,
                               multiprocessing_context="forkserver"))
    except Exception as e:
        assert "worker_init_fn" in str(e), str(e)
msgs = [str(x.message) for x in w if "pickle error" in str(x.message)]
assert len(msgs) == 1, [str(x.message) for x in w]
print("OK")
""", timeout=90)
    assert "OK" in r.stdout, r.stdout + r.stderr


def test_quarantine_names_str_indices(script):
    r = script(SETUP + """
from torch.utils.data import Sampler
class Keys(Sampler):
    def __len__(self): return 32
    def __iter__(self): return (f"k{i}" for i in range(32))
loader = stoker.DataLoader(Keyed("k9"), batch_size=4, num_workers=2, sampler=Keys(),
                           on_error="skip")
got = list(loader)
assert labels(got) == [i for i in range(32) if i != 9], labels(got)
assert [s.index for s in loader.skipped] == ["k9"], loader.skipped
assert [d.index for d in loader.deaths] == ["k9", "k9"], loader.deaths
print("OK")
""", timeout=90)
    assert "OK" in r.stdout, r.stdout + r.stderr


def test_slow_start_up_is_not_killed_as_a_hang(script):
    # hang_timeout bounds one sample: a worker_init_fn that takes longer than it is not a hang.
    r = script(SETUP + """
import time
def init(worker_id):
    time.sleep(6)
loader = stoker.DataLoader(Squares(16), batch_size=4, num_workers=2, hang_timeout=2,
                           worker_init_fn=init)
assert labels(list(loader)) == list(range(16))
assert not loader.deaths, loader.deaths
print("OK")
""", timeout=90)
    assert "OK" in r.stdout, r.stdout + r.stderr


def test_a_pause_in_the_training_loop_is_not_a_hang(script):
    # An evaluation or a checkpoint save longer than hang_timeout, mid-epoch and between epochs:
    # idle workers whose results wait in their channels are healthy, not stuck.
    r = script(SETUP + """
import time, logging
logging.basicConfig()
loader = stoker.DataLoader(Squares(32), batch_size=4, num_workers=2, hang_timeout=1,
                           persistent_workers=True)
for epoch in range(2):
    got = []
    for i, b in enumerate(loader):
        got.append(b)
        if i == 2:
            time.sleep(3)
    assert labels(got) == list(range(32)), labels(got)
    time.sleep(3)
assert not loader.deaths, loader.deaths
print("OK")
""", timeout=90)
    assert "OK" in r.stdout, r.stdout + r.stderr
    assert "without starting them" not in r.stderr, r.stderr
