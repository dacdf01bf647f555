"""Scenarios of tests/loader/test_errors.py: bad samples, batches and workers, each in a fresh process,
end in one clear error in the main process (each scenario returns, and so passes, only once
the error it expects has been raised and checked: `expect_raises` fails it when none comes)."""

from __future__ import annotations

import gc
import re
import signal
import time

import stoker
from scenario_datasets import (
    ExitsAt,
    KillsSelfAt,
    RaggedAt,
    RaisesAt,
    RewritesReadySlots,
    Squares,
    collate_with_lock,
)
from scenarios import expect_raises
from scenarios.probes import helpers_started, leftovers, open_fds


def exception_in_getitem_keeps_type_index_and_traceback():
    """A ValueError in __getitem__ arrives as ValueError naming the index, with its traceback."""
    loader = stoker.DataLoader(RaisesAt(13), batch_size=4, num_workers=2)
    with expect_raises(ValueError) as raised:
        for _ in loader:
            pass
    msg = str(raised.value)
    assert "dataset index 13" in msg, msg
    assert "cannot decode sample 13: corrupt file" in msg, msg
    assert "Traceback (most recent call last)" in msg and "__getitem__" in msg, msg
    assert "worker process" in msg, msg


def keyerror_in_getitem_stays_keyerror():
    """A KeyError in __getitem__ arrives as KeyError naming the index."""
    loader = stoker.DataLoader(RaisesAt(2, exc=KeyError), batch_size=2, num_workers=1)
    with expect_raises(KeyError) as raised:
        list(loader)
    assert "dataset index 2" in str(raised.value), str(raised.value)


def samples_that_do_not_stack():
    """Samples that do not stack raise CollateError naming the field, indices and shapes."""
    loader = stoker.DataLoader(RaggedAt(6), batch_size=4, num_workers=2)
    with expect_raises(RuntimeError) as raised:
        list(loader)
    e = raised.value
    msg = str(e)
    assert isinstance(e, stoker.CollateError), type(e)
    assert "['image']" in msg, msg
    assert "dataset index 6" in msg and "dataset index 4" in msg, msg
    assert "[3, 4, 4]" in msg and "[3, 5, 4]" in msg, msg


def unpicklable_batch():
    """A batch holding a lock raises TypeError naming it instead of hanging."""
    loader = stoker.DataLoader(Squares(), batch_size=4, num_workers=2,
                               collate_fn=collate_with_lock)
    with expect_raises(TypeError) as raised:
        next(iter(loader))
    msg = str(raised.value)
    assert "Unpicklable" in msg and "lock" in msg, msg


def worker_killed_by_signal(signame):
    """A worker that kills itself with `signame` raises WorkerCrashed naming signal and pid."""
    loader = stoker.DataLoader(KillsSelfAt(9, getattr(signal, signame)), batch_size=4,
                               num_workers=2)
    with expect_raises(stoker.WorkerCrashed) as raised:
        list(loader)
    e = raised.value
    assert e.signal == signame, e.signal
    assert e.pid and str(e.pid) in str(e), str(e)
    assert "worker" in str(e) and signame in str(e), str(e)
    assert e.worker_id in (0, 1), e.worker_id
    # stoker's words first (the line a person and a log search see), torch's after them,
    # still found by torch's own pattern; the type stays a RuntimeError, as torch's
    first = str(e).splitlines()[0]
    assert first.startswith(f"DataLoader worker {e.worker_id} (pid {e.pid}) was killed by "
                            f"signal {signame}"), first
    assert "dataset index 9" in first or signame == "SIGKILL", first
    assert re.search(rf"DataLoader worker \(pid {e.pid}\) is killed by signal: ", str(e)), str(e)
    assert isinstance(e, RuntimeError)


def worker_exit_code():
    """A worker that exits with code 3 raises WorkerCrashed naming the code."""
    loader = stoker.DataLoader(ExitsAt(5, code=3), batch_size=2, num_workers=2)
    with expect_raises(stoker.WorkerCrashed) as raised:
        list(loader)
    e = raised.value
    assert e.exit_code == 3 and e.signal is None, (e.exit_code, e.signal)
    assert "exited with code 3" in str(e), str(e)
    first = str(e).splitlines()[0]
    assert first == (f"DataLoader worker {e.worker_id} (pid {e.pid}) exited with code 3 "
                     "while loading dataset index 5."), first
    assert re.search(r"DataLoader worker \(pid\(s\) \d+\) exited unexpectedly", str(e)), str(e)


def no_worker_or_fd_survives_errors():
    """After three loaders that fail, no worker and no descriptor is left (multiprocessing's
    fork server and resource tracker, which the first forkserver start makes for the process
    and keeps, started first: they are not the loaders', probes.helpers)."""
    helpers_started()
    before = open_fds()
    for ds, error in ((RaisesAt(3), ValueError), (KillsSelfAt(3), stoker.WorkerCrashed),
                      (RaggedAt(3), stoker.CollateError)):
        with expect_raises(error):
            list(stoker.DataLoader(ds, batch_size=2, num_workers=2))
    gc.collect()
    assert not leftovers(), leftovers()
    assert open_fds() == before, (before, open_fds())


def slot_rewritten_before_it_was_read():
    """A slot written again before it was read raises CorruptBatchError naming the generation."""
    loader = stoker.DataLoader(RewritesReadySlots(at=8, n=64), batch_size=4, num_workers=1)
    with expect_raises(stoker.CorruptBatchError) as raised:
        for _ in loader:
            time.sleep(0.2)  # the worker, ahead, loads the next samples while a batch waits
    msg = str(raised.value)
    assert "written again before it was read" in msg and "generation" in msg, msg
    assert "state 'ready')" not in msg.split("(it holds")[0], msg
