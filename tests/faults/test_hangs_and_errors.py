"""Hangs explained with the worker's own stack; Python errors under raise / skip / retry."""

from __future__ import annotations

from .test_worker_deaths import SETUP


def test_timeout_raises_worker_hung_with_stack_and_index(script):
    r = script(SETUP + """
import time
loader = stoker.DataLoader(HangsAt(9), batch_size=2, num_workers=2, timeout=2)
t = time.monotonic()
try:
    list(loader)
except stoker.WorkerHung as e:
    took = time.monotonic() - t
    msg = str(e)
    assert isinstance(e, RuntimeError)
    assert msg.startswith("DataLoader timed out after 2 seconds"), msg
    assert e.index == 9 and e.worker_id == 0 and e.pid, (e.index, e.worker_id, e.pid)
    assert "_wait_forever" in e.stack and "scenario_datasets.py" in e.stack, e.stack
    assert "dataset index 9" in msg and "_wait_forever" in msg, msg
    assert took < 10, took
    print("OK")
del loader
import gc; gc.collect()
assert not children(), children()
""", timeout=60)
    assert "OK" in r.stdout, r.stdout + r.stderr


def test_hang_timeout_kills_restarts_and_then_quarantines(script):
    r = script(SETUP + """
loader = stoker.DataLoader(HangsAt(9, n=24), batch_size=2, num_workers=2, hang_timeout=1,
                           on_error="skip")
got = list(loader)
assert labels(got) == [i for i in range(24) if i != 9], labels(got)
assert len(loader.deaths) == 2 and all(d.index == 9 for d in loader.deaths), loader.deaths
assert "hung for" in loader.deaths[0].cause, loader.deaths[0].cause
assert [s.index for s in loader.skipped] == [9]
print("OK")
""", timeout=60)
    assert "OK" in r.stdout, r.stdout + r.stderr
    assert "_wait_forever" in r.stderr or "hung for" in r.stderr, r.stderr


def test_on_error_skip_drops_the_sample_and_records_it(script):
    r = script(SETUP + """
loader = stoker.DataLoader(RaisesAt(13), batch_size=4, num_workers=2, on_error="skip")
got = list(loader)
assert labels(got) == [i for i in range(64) if i != 13]
assert [len(b[1]) for b in got].count(3) == 1
(rec,) = loader.skipped
assert rec.index == 13 and "ValueError" in rec.reason and rec.epoch == 1, rec
print("OK")
""")
    assert "OK" in r.stdout, r.stdout + r.stderr
    assert r.stderr.count("skipped dataset index 13") == 1, r.stderr


def test_on_error_skip_in_process(script):
    r = script(SETUP + """
loader = stoker.DataLoader(RaisesAt(13), batch_size=4, num_workers=0, on_error="skip")
got = list(loader)
assert labels(got) == [i for i in range(64) if i != 13]
assert [s.index for s in loader.skipped] == [13]
print("OK")
""")
    assert "OK" in r.stdout, r.stdout + r.stderr


def test_on_error_retry_recovers_transient_errors(script):
    r = script(SETUP + """
marks = tempfile.mkdtemp()
loader = stoker.DataLoader(FlakyAt(13, marks, times=2), batch_size=4, num_workers=2,
                           on_error="retry", max_retries=3)
assert labels(list(loader)) == list(range(64))
marks = tempfile.mkdtemp()
loader = stoker.DataLoader(FlakyAt(13, marks, times=5), batch_size=4, num_workers=2,
                           on_error="retry", max_retries=3)
try:
    list(loader)
except OSError as e:
    assert "transient read error on sample 13" in str(e) and "dataset index 13" in str(e)
    print("OK")
""")
    assert "OK" in r.stdout, r.stdout + r.stderr


def test_policies_are_validated():
    import pytest

    import stoker
    from scenario_datasets import Squares

    for kwargs in ({"on_error": "ignore"}, {"on_worker_death": "pray"}, {"max_restarts": -1},
                   {"quarantine_after": 0}, {"hang_timeout": 0}, {"max_retries": -2}):
        with pytest.raises(ValueError):
            stoker.DataLoader(Squares(), **kwargs)


def test_retry_on_a_failing_stream_raises_instead_of_ending_early(script):
    r = script(SETUP + """
loader = stoker.DataLoader(RaisesInStream(), batch_size=2, num_workers=1, on_error="retry")
try:
    list(loader)
except ValueError as e:
    assert "stream broke at element 3" in str(e), e
    print("OK")
""", timeout=60)
    assert "OK" in r.stdout, r.stdout + r.stderr
