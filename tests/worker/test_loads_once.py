"""Each sample loaded once an epoch and never more than the width at once, in real workers
(tests/scenarios/loads_once.py): a number, "auto" and an async dataset left unset, over a dataset
that computes and one that waits. "auto" over a computing dataset settles at one thread with the
next batch already started: that batch was loaded a second time before the gate (2 runs of 3)."""

from __future__ import annotations

import pytest

from support.scenarios import run_ok

CASES = {
    "3_threads_computing": ([3], {}),
    "auto_computing": (["auto"], {}),
    "auto_computing_two_epochs": (["auto"], {"epochs": 2, "n": 512}),
    "8_threads_waiting": ([8, "wait", 10, 512], {}),
    "auto_waiting": (["auto", "wait", 20, 512], {}),
    # coroutines all start before any of them waits: many at once, with no setting
    "async_unset_waiting": ([None, "wait", 20, 512], {"is_async": True, "at_least": 8}),
    "1_thread_computing": ([1, "cpu", 1, 256], {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_sample_loaded_once_within_the_width(case):
    args, kwargs = CASES[case]
    r = run_ok("loads_once.each_sample_once", *args, kwargs=kwargs, timeout=180)
    assert "most at once" in r.stdout
