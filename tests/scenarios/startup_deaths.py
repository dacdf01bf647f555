"""Workers that die while they start (tests/loader/iterators/test_startup_deaths.py): killed by a signal
before their first sample (the OOM killer choosing the newest process, an operator, a fault in
native code), they are restarted within max_restarts like any other death; a start-up that
raises ends the run at once, with its traceback; one killed at every start is named with its
history once the budget is spent."""

from __future__ import annotations

import signal
import tempfile

import stoker
from scenario_datasets import DieAtStart, DiesWhileStarting, RaisesWhileStarting, Squares
from scenarios import expect_raises
from scenarios.probes import labels, leftovers

SIGNALS = {"SIGKILL": signal.SIGKILL, "SIGSEGV": signal.SIGSEGV}


def _loader(context: str, sig: str, times, n: int = 32, **kw):
    """Spawn: the worker dies unpickling the dataset, before its status page exists; fork:
    in worker_init_fn, before its first sample."""
    marks = tempfile.mkdtemp()
    signum = SIGNALS[sig]
    if context == "fork":
        return stoker.DataLoader(Squares(n), batch_size=4, num_workers=2,
                                 multiprocessing_context="fork",
                                 worker_init_fn=DieAtStart(marks, signum, times), **kw)
    return stoker.DataLoader(DiesWhileStarting(marks, signum, times, n), batch_size=4,
                             num_workers=2, multiprocessing_context=context, **kw)


def killed_at_start_is_restarted(context: str, sig: str, persistent: bool = False):
    """Two starts die by `sig`: both restarted, every sample once in order, both deaths named
    as start-up deaths."""
    loader = _loader(context, sig, 2, persistent_workers=persistent)
    for _ in range(2 if persistent else 1):
        assert labels(list(loader)) == list(range(32))
    deaths = loader.deaths
    assert len(deaths) == 2, deaths
    assert all(d.signal == sig for d in deaths), deaths
    if context != "fork":  # before its status page: named as a start-up death
        assert all("while starting" in str(d) for d in deaths), [str(d) for d in deaths]
    del loader
    assert not leftovers(), leftovers()


def killed_at_every_start_names_the_history(context: str):
    """A worker that is killed at every start: restarted until max_restarts is spent, then
    WorkerCrashed with every death of the epoch."""
    loader = _loader(context, "SIGKILL", None, max_restarts=3)
    with expect_raises(stoker.WorkerCrashed) as raised:
        list(loader)
    msg = str(raised.value)
    assert "max_restarts=3" in msg and "Deaths this epoch" in msg, msg
    assert msg.count("SIGKILL") >= 4, msg
    if context != "fork":
        assert msg.count("while starting") >= 4, msg
    assert len(loader.deaths) == 4, loader.deaths
    assert not leftovers(), leftovers()


def raise_policy_names_a_start_up_kill(context: str):
    """on_worker_death="raise": a worker killed while starting ends the run, named as killed
    while starting (not blamed on pickling)."""
    loader = _loader(context, "SIGKILL", 1, on_worker_death="raise")
    with expect_raises(stoker.WorkerCrashed) as raised:
        list(loader)
    msg = str(raised.value)
    assert "SIGKILL" in msg and "pickl" not in msg, msg
    if context != "fork":
        assert "while starting" in msg, msg
    assert not leftovers(), leftovers()


def start_up_that_raises_ends_at_once():
    """A dataset that cannot be unpickled in the worker (spawn): the run ends at the first
    death, with the traceback on stderr and no restart, whatever the budget."""
    loader = stoker.DataLoader(RaisesWhileStarting(16), batch_size=4, num_workers=2,
                               multiprocessing_context="spawn", max_restarts=50)
    with expect_raises(stoker.WorkerCrashed) as raised:
        list(loader)
    e = raised.value
    assert "while starting" in str(e) and e.exit_code not in (None, 0), str(e)
    assert len(loader.deaths) == 1, loader.deaths
    assert not leftovers(), leftovers()


def _raising_init(worker_id):
    raise RuntimeError(f"worker {worker_id}: no credentials for s3://bucket/shards")


def init_fn_that_raises_ends_at_once():
    """A worker_init_fn that raises ends the run at once with its traceback, restart policy
    or not."""
    loader = stoker.DataLoader(Squares(16), batch_size=4, num_workers=2,
                               worker_init_fn=_raising_init, max_restarts=50)
    # torch raises the worker's exception type, with its traceback
    with expect_raises(Exception) as raised:
        list(loader)
    text = f"{type(raised.value).__name__}: {raised.value}"
    assert "no credentials for s3://bucket/shards" in text, text
    assert "_raising_init" in text, text  # the worker's traceback
    assert not loader.deaths, loader.deaths
    assert not leftovers(), leftovers()
