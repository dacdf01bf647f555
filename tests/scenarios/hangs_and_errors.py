"""Hangs explained with the worker's own stack; Python errors under raise / skip / retry
(tests/loader/iterators/test_hangs_and_errors.py)."""

from __future__ import annotations

import gc
import tempfile

import stoker
from scenario_datasets import FlakyAt, HangsAt, RaisesAt, RaisesInStream
from scenarios import expect_raises
from scenarios.probes import labels, leftovers


def timeout_raises_worker_hung():
    """`timeout` raises WorkerHung within seconds, with the index, the worker and its stack.
    Forked workers: `timeout` bounds each wait for a batch, the first one's too, which holds the
    workers' start; spawned ones (3.14's forkserver) import torch first, which a busy machine
    may take past 2 s over, and the hang would then be one at start-up, with no index."""
    loader = stoker.DataLoader(HangsAt(9), batch_size=2, num_workers=2, timeout=2,
                               multiprocessing_context="fork")
    with expect_raises(stoker.WorkerHung) as raised:  # (its test's bound: the scenario's)
        list(loader)
    e = raised.value
    msg = str(e)
    assert isinstance(e, RuntimeError)
    assert msg.startswith("DataLoader timed out after 2 seconds"), msg
    assert e.index == 9 and e.worker_id == 0 and e.pid, (e.index, e.worker_id, e.pid)
    assert "_wait_forever" in e.stack and "scenario_datasets.py" in e.stack, e.stack
    assert "dataset index 9" in msg and "_wait_forever" in msg, msg
    del loader, e, raised
    gc.collect()
    assert not leftovers(), leftovers()


def hang_timeout_quarantines():
    """`hang_timeout` kills a hung worker, restarts it, and quarantines the sample hung twice."""
    loader = stoker.DataLoader(HangsAt(9, n=24), batch_size=2, num_workers=2, hang_timeout=1,
                               on_error="skip")
    got = list(loader)
    assert labels(got) == [i for i in range(24) if i != 9], labels(got)
    assert len(loader.deaths) == 2 and all(d.index == 9 for d in loader.deaths), loader.deaths
    assert "hung for" in loader.deaths[0].cause, loader.deaths[0].cause
    assert [s.index for s in loader.skipped] == [9]


def skip_drops_the_sample():
    """on_error="skip" drops the failing sample from its batch and records why, in workers."""
    loader = stoker.DataLoader(RaisesAt(13), batch_size=4, num_workers=2, on_error="skip")
    got = list(loader)
    assert labels(got) == [i for i in range(64) if i != 13]
    assert [len(b[1]) for b in got].count(3) == 1
    (rec,) = loader.skipped
    assert rec.index == 13 and "ValueError" in rec.reason and rec.epoch == 1, rec


def skip_in_process():
    """on_error="skip" drops the failing sample with num_workers=0 too."""
    loader = stoker.DataLoader(RaisesAt(13), batch_size=4, num_workers=0, on_error="skip")
    got = list(loader)
    assert labels(got) == [i for i in range(64) if i != 13]
    assert [s.index for s in loader.skipped] == [13]


def retry_recovers_transient_errors():
    """on_error="retry" gets past two failures of a sample, and raises naming it after five."""
    marks = tempfile.mkdtemp()
    loader = stoker.DataLoader(FlakyAt(13, marks, times=2), batch_size=4, num_workers=2,
                               on_error="retry", max_retries=3)
    assert labels(list(loader)) == list(range(64))
    marks = tempfile.mkdtemp()
    loader = stoker.DataLoader(FlakyAt(13, marks, times=5), batch_size=4, num_workers=2,
                               on_error="retry", max_retries=3)
    with expect_raises(OSError) as raised:
        list(loader)
    msg = str(raised.value)
    assert "transient read error on sample 13" in msg and "dataset index 13" in msg, msg


def retry_on_a_failing_stream_raises():
    """on_error="retry" on an iterable dataset that breaks raises instead of ending early."""
    loader = stoker.DataLoader(RaisesInStream(), batch_size=2, num_workers=1, on_error="retry")
    with expect_raises(ValueError) as raised:
        list(loader)
    assert "stream broke at element 3" in str(raised.value), raised.value
