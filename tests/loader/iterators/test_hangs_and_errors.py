"""Hangs explained with the worker's own stack; Python errors under raise / skip / retry.

The scenarios run in a fresh interpreter each: tests/scenarios/hangs_and_errors.py."""

from __future__ import annotations

import pytest

from support.scenarios import run_ok


def test_timeout_raises_worker_hung_with_stack_and_index():
    run_ok("hangs_and_errors.timeout_raises_worker_hung", timeout=60)


def test_hang_timeout_kills_restarts_and_then_quarantines():
    r = run_ok("hangs_and_errors.hang_timeout_quarantines", timeout=60)
    assert "_wait_forever" in r.stderr or "hung for" in r.stderr, r.stderr


def test_on_error_skip_drops_the_sample_and_records_it():
    r = run_ok("hangs_and_errors.skip_drops_the_sample")
    assert r.stderr.count("skipped dataset index 13") == 1, r.stderr


def test_on_error_skip_in_process():
    run_ok("hangs_and_errors.skip_in_process")


def test_on_error_retry_recovers_transient_errors():
    run_ok("hangs_and_errors.retry_recovers_transient_errors")


@pytest.mark.unit
def test_policies_are_validated():
    import pytest

    import stoker
    from scenario_datasets import Squares

    for kwargs in ({"on_error": "ignore"}, {"on_worker_death": "pray"}, {"max_restarts": -1},
                   {"quarantine_after": 0}, {"hang_timeout": 0}, {"max_retries": -2}):
        with pytest.raises(ValueError):
            stoker.DataLoader(Squares(), **kwargs)


def test_retry_on_a_failing_stream_raises_instead_of_ending_early():
    run_ok("hangs_and_errors.retry_on_a_failing_stream_raises", timeout=60)
