"""Settings real training jobs create (tests/loader/iterators/test_where_jobs_run.py): other threads,
stopped or stuck workers, dropped iterators, redirected output, the user's gc.freeze(), indices
that are not ints."""

from __future__ import annotations

import functools
import gc
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import warnings
from typing import List

import numpy as np
from torch.utils.data import Dataset, Sampler

import stoker
from scenario_datasets import Keyed, KillsOnceAt, KillsSelfAt, Slow, Squares
from scenarios import expect_raises
from scenarios.probes import labels


class Prints(Dataset):
    """Eight samples, each printing `word` and its index on the worker's stdout."""

    def __init__(self, word):
        self.word = word

    def __len__(self):
        return 8

    def __getitem__(self, i):
        print(self.word, i)
        return i


class NpSampler(Sampler):
    """0 .. n-1 as numpy int64s, as a sampler built on numpy hands them out."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __iter__(self):
        return (np.int64(i) for i in range(self.n))


class Keys(Sampler):
    """The str keys "k0" .. "k31"."""

    def __len__(self):
        return 32

    def __iter__(self):
        return (f"k{i}" for i in range(32))


# A worker_init_fn no start method but fork can send: a lambda at a script's top level, which
# pickle looks up by its name, "<lambda>", and does not find.
def _init_with(lock, worker_id):
    pass


# a lambda would cross by value (stoker/pickling/by_value.py); a lock held by the function cannot
_unpicklable_init = functools.partial(_init_with, threading.Lock())


def _sleep_six_seconds(worker_id):
    """A worker_init_fn slower than the hang_timeout of the scenario that uses it."""
    time.sleep(6)


def stats_from_another_thread():
    """stats() called without pause from a monitoring thread through two epochs never fails."""
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
    stop.set()
    t.join()
    assert not errors, errors[:3]
    assert calls[0] > 50, calls


def worker_output_reaches_redirected_stdout(out: str):
    """With stdout redirected to the file `out`, workers' prints reach it; the end of an epoch and
    an iterator dropped mid-epoch print nothing on stderr (which ends with "DONE")."""
    runners = os.dup(1)  # the stdout the runner prints "OK" on, given back at the end
    sys.stdout = open(out, "w")
    os.dup2(sys.stdout.fileno(), 1)
    list(stoker.DataLoader(Prints("sample"), batch_size=2, num_workers=2))
    it = iter(stoker.DataLoader(Prints("dropped"), batch_size=1, num_workers=2, prefetch_factor=4))
    next(it)
    del it
    gc.collect()
    sys.stderr.write("DONE\n")
    sys.stdout.close()
    os.dup2(runners, 1)
    os.close(runners)
    sys.stdout = sys.__stdout__


def users_gc_freeze_is_kept():
    """Starting workers by fork and by spawn leaves the user's gc.freeze() in place."""
    junk = [[i] for i in range(20000)]  # noqa: F841  (what the freeze holds)
    gc.freeze()
    frozen = gc.get_freeze_count()
    assert frozen > 10000
    for ctx in ("fork", "spawn"):
        got = list(stoker.DataLoader(Squares(16), batch_size=4, num_workers=2,
                                     multiprocessing_context=ctx))
        assert labels(got) == list(range(16))
        # (objects freed since leave the frozen generation: a few hundred, not all of them)
        assert gc.get_freeze_count() > frozen * 0.9, (ctx, frozen, gc.get_freeze_count())


def sigstopped_idle_worker_restarted():
    """An idle persistent worker SIGSTOPped takes no queued work: hang_timeout names it, kills
    and restarts it, and the epoch completes."""
    logging.basicConfig()
    loader = stoker.DataLoader(Squares(64), batch_size=4, num_workers=2, hang_timeout=2,
                               persistent_workers=True)
    assert labels(list(loader)) == list(range(64))   # workers are idle now
    os.kill(loader._iterator._workers[1].pid, signal.SIGSTOP)
    got = list(loader)  # (its test's bound: the scenario's)
    assert labels(got) == list(range(64)), labels(got)
    d = loader.deaths[-1]
    assert d.worker_id == 1 and "did not take its queued work" in d.cause, d


def sigstopped_worker_named_without_hang_timeout():
    """Without hang_timeout a SIGSTOPped worker is named stopped by stats() and by the
    WorkerHung that `timeout` raises."""
    logging.basicConfig()
    loader = stoker.DataLoader(Squares(64), batch_size=4, num_workers=2, timeout=8,
                               persistent_workers=True)
    list(loader)
    victim = loader._iterator._workers[0].pid
    os.kill(victim, signal.SIGSTOP)
    seen = []

    def watch():
        for _ in range(100):
            for w in loader.stats()["workers"]:
                if "stuck" in w:
                    seen.append(w["stuck"])
                    return
            time.sleep(0.1)

    th = threading.Thread(target=watch)
    th.start()
    try:
        with expect_raises(stoker.WorkerHung) as raised:
            list(loader)
    finally:
        th.join()
        os.kill(victim, signal.SIGCONT)
    assert "stopped (state T" in str(raised.value), str(raised.value)
    assert seen and "stopped" in seen[0], seen


def forking_with_other_threads_warns_once():
    """Forking workers while another thread runs warns once, naming it; forkserver does not."""
    ev = threading.Event()
    t = threading.Thread(target=ev.wait, name="metrics-pusher", daemon=True)
    t.start()
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


def quarantine_names_numpy_indices():
    """A sample quarantined under a sampler of numpy ints is named by its index."""
    loader = stoker.DataLoader(KillsSelfAt(9, signal.SIGSEGV, n=32), batch_size=4,
                               num_workers=2, sampler=NpSampler(32), on_error="skip")
    got = list(loader)
    assert labels(got) == [i for i in range(32) if i != 9], labels(got)
    assert [int(s.index) for s in loader.skipped] == [9], loader.skipped
    assert len(loader.deaths) == 2


def quarantine_counts_per_epoch():
    """One death at the same index in each of two epochs quarantines nothing."""
    marks = tempfile.mkdtemp()
    loader = stoker.DataLoader(KillsOnceAt(bad=[5], marks=marks, n=16), batch_size=2,
                               num_workers=2, persistent_workers=True)
    assert labels(list(loader)) == list(range(16))
    shutil.rmtree(marks)
    os.makedirs(marks)
    assert labels(list(loader)) == list(range(16))
    assert len(loader.deaths) == 2 and not loader.skipped and not loader.stats()["quarantined"]


def typing_alias_workers_and_pickle_warning():
    """DataLoader[...] is a typing alias; _workers lists live processes; an unpicklable
    worker_init_fn under forkserver is named, with one pickle-error warning."""
    alias = stoker.DataLoader[List[int]]
    assert alias.__origin__ is stoker.DataLoader
    it = iter(stoker.DataLoader(Squares(8), batch_size=2, num_workers=2))
    ws = it._workers
    assert len(ws) == 2 and all(w.pid > 0 and w.is_alive() for w in ws)
    list(it)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with expect_raises(Exception, match="worker_init_fn"):
            list(stoker.DataLoader(Squares(8), batch_size=2, num_workers=1,
                                   worker_init_fn=_unpicklable_init,
                                   multiprocessing_context="forkserver"))
    msgs = [str(x.message) for x in w if "pickle error" in str(x.message)]
    assert len(msgs) == 1, [str(x.message) for x in w]


def quarantine_names_str_indices():
    """A sample quarantined under a sampler of str keys is named by its key."""
    loader = stoker.DataLoader(Keyed("k9"), batch_size=4, num_workers=2, sampler=Keys(),
                               on_error="skip")
    got = list(loader)
    assert labels(got) == [i for i in range(32) if i != 9], labels(got)
    assert [s.index for s in loader.skipped] == ["k9"], loader.skipped
    assert [d.index for d in loader.deaths] == ["k9", "k9"], loader.deaths


def slow_start_up_is_not_a_hang():
    """A worker_init_fn longer than hang_timeout is not killed as a hang."""
    loader = stoker.DataLoader(Squares(16), batch_size=4, num_workers=2, hang_timeout=2,
                               worker_init_fn=_sleep_six_seconds)
    assert labels(list(loader)) == list(range(16))
    assert not loader.deaths, loader.deaths


def pause_in_the_loop_is_not_a_hang():
    """Pauses longer than hang_timeout mid-epoch and between epochs kill no idle worker."""
    logging.basicConfig()
    loader = stoker.DataLoader(Squares(32), batch_size=4, num_workers=2, hang_timeout=1,
                               persistent_workers=True)
    for _epoch in range(2):
        got = []
        for i, b in enumerate(loader):
            got.append(b)
            if i == 2:
                time.sleep(3)
        assert labels(got) == list(range(32)), labels(got)
        time.sleep(3)
    assert not loader.deaths, loader.deaths
