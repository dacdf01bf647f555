"""Workers that die (tests/loader/iterators/test_worker_deaths.py): every death named, survived when
allowed, every sample exactly once."""

from __future__ import annotations

import gc
import os
import signal
import sys
import tempfile
import time

import torch

import stoker
from scenario_datasets import KillsOnceAt, KillsSelfAt, Slow, Squares
from scenarios import expect_raises
from scenarios.probes import labels, leftovers


class SaysGoodbye(Squares):
    """Sample 7 says why on stderr and exits with code 4, as a worker's sys.exit() does."""

    def __getitem__(self, i):
        if i == 7:
            print("cannot open /data/shard-7.tar: quota exceeded", file=sys.stderr)
            sys.exit(4)
        return super().__getitem__(i)


def repeated_sigkill():
    """Five SIGKILLs: each restarted, every index once, in torch's shuffled order, no child left."""
    marks = tempfile.mkdtemp()
    ds = KillsOnceAt(bad=[3, 17, 18, 40, 63], marks=marks, n=64)
    loader = stoker.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2,
                               generator=torch.Generator().manual_seed(0))
    got = list(loader)
    assert labels(got) == list(range(64)), labels(got)
    assert len(loader.deaths) == 5, loader.deaths
    assert all(d.signal == "SIGKILL" for d in loader.deaths)
    assert {d.index for d in loader.deaths} == {3, 17, 18, 40, 63}, [d.index for d in loader.deaths]
    # the order is torch's: the same shuffled batches as an undisturbed run
    ref = list(stoker.DataLoader(Squares(64), batch_size=4, shuffle=True, num_workers=2,
                                 generator=torch.Generator().manual_seed(0)))
    assert [b[1].tolist() for b in got] == [b[1].tolist() for b in ref]
    assert not leftovers(), leftovers()


def external_sigkill_over_epochs():
    """Persistent workers killed from outside twice an epoch for three epochs lose no sample."""
    loader = stoker.DataLoader(Slow(48), batch_size=4, num_workers=2, persistent_workers=True)
    for epoch in range(3):
        seen = []
        for i, b in enumerate(loader):
            seen.extend(int(x) for x in b[1])
            if i in (2 + epoch, 7 + epoch):  # different samples each time: none looks poisonous
                victim = loader.stats()["workers"][i % 2]["pid"]
                os.kill(victim, signal.SIGKILL)
        assert sorted(seen) == list(range(48)), (epoch, sorted(seen))
    assert len(loader.deaths) == 6, len(loader.deaths)
    it = loader._iterator
    del loader, it, b
    gc.collect()
    assert not leftovers(), leftovers()


def segfault_raises():
    """A segfault under on_worker_death="raise" names the signal, the index and the worker's stack."""
    loader = stoker.DataLoader(KillsSelfAt(21, signal.SIGSEGV), batch_size=4, num_workers=2,
                               on_worker_death="raise")
    with expect_raises(stoker.WorkerCrashed) as raised:
        list(loader)
    e = raised.value
    msg = str(e)
    assert e.signal == "SIGSEGV" and e.indices == [21], (e.signal, e.indices)
    assert "dataset index 21" in msg, msg
    assert "Segmentation fault" in msg and "__getitem__" in msg, msg   # faulthandler's stack
    assert "scenario_datasets.py" in msg, msg
    assert not leftovers(), leftovers()


def segfault_quarantined():
    """Under on_error="skip" a sample that segfaults twice is quarantined, and stays skipped."""
    loader = stoker.DataLoader(KillsSelfAt(21, signal.SIGSEGV), batch_size=4, num_workers=2,
                               on_error="skip")
    got = list(loader)
    assert labels(got) == [i for i in range(64) if i != 21], labels(got)
    assert [s.index for s in loader.skipped] == [21], loader.skipped
    assert "quarantined after 2 worker deaths" in loader.skipped[0].reason, loader.skipped
    assert len(loader.deaths) == 2
    # the next epoch does not touch it again
    got = list(loader)
    assert labels(got) == [i for i in range(64) if i != 21]
    assert len(loader.deaths) == 2 and len(loader.skipped) == 1


def poison_sample_raises():
    """Without on_error="skip" a poison sample raises, naming it and the option that skips it."""
    loader = stoker.DataLoader(KillsSelfAt(5, signal.SIGKILL), batch_size=2, num_workers=2)
    with expect_raises(stoker.WorkerCrashed) as raised:
        list(loader)
    e = raised.value
    assert e.indices == [5], e.indices
    assert "quarantined as poison" in str(e) and "on_error='skip'" in str(e), str(e)


def restart_budget_raises():
    """Past max_restarts the loader raises with the epoch's deaths, and leaves no child."""
    marks = tempfile.mkdtemp()
    ds = KillsOnceAt(bad=range(0, 64, 4), marks=marks, n=64)
    loader = stoker.DataLoader(ds, batch_size=4, num_workers=2, max_restarts=3)
    with expect_raises(stoker.WorkerCrashed) as raised:
        list(loader)
    msg = str(raised.value)
    assert "max_restarts=3" in msg and "Deaths this epoch" in msg, msg
    assert msg.count("SIGKILL") >= 4, msg
    assert not leftovers(), leftovers()


def exit_code_names_stderr():
    """A worker's sys.exit(4) is named with its code, its last stderr line and the index."""
    loader = stoker.DataLoader(SaysGoodbye(), batch_size=2, num_workers=2,
                               on_worker_death="raise")
    with expect_raises(stoker.WorkerCrashed) as raised:
        list(loader)
    e = raised.value
    msg = str(e)
    assert e.exit_code == 4 and e.signal is None, (e.exit_code, e.signal)
    assert "exited with code 4" in msg and "quota exceeded" in msg and "dataset index 7" in msg, msg


def last_task_quarantined():
    """Quarantining the only task still in flight ends the epoch instead of hanging it."""
    loader = stoker.DataLoader(KillsSelfAt(3, signal.SIGKILL, n=4), batch_size=1, num_workers=1,
                               on_error="skip")
    assert labels(list(loader)) == [0, 1, 2]
    assert [s.index for s in loader.skipped] == [3]


def persistent_worker_killed_between_epochs():
    """A persistent worker killed between epochs, or after a broken-off one, is replaced."""
    loader = stoker.DataLoader(Squares(16), batch_size=4, num_workers=2, persistent_workers=True)
    assert labels(list(loader)) == list(range(16))
    os.kill(loader.stats()["workers"][0]["pid"], signal.SIGKILL)
    time.sleep(0.2)
    assert labels(list(loader)) == list(range(16))
    it = iter(loader)
    next(it)                      # break out with work in flight ...
    os.kill(loader.stats()["workers"][1]["pid"], signal.SIGKILL)
    assert labels(list(loader)) == list(range(16))   # ... the next epoch still starts
