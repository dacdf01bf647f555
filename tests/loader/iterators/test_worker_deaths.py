"""Workers that die: every death named, survived when allowed, every sample exactly once.

The scenarios run in a fresh interpreter each: tests/scenarios/worker_deaths.py."""

from __future__ import annotations

from support.scenarios import run_ok


def test_repeated_sigkill_restarts_and_delivers_every_index_exactly_once():
    r = run_ok("worker_deaths.repeated_sigkill", timeout=120)
    assert r.stderr.count("restarted it") == 5, r.stderr


def test_external_sigkill_with_persistent_workers_over_epochs():
    run_ok("worker_deaths.external_sigkill_over_epochs", timeout=120)


def test_segfault_raises_with_signal_index_and_python_stack():
    run_ok("worker_deaths.segfault_raises", timeout=60)


def test_segfault_at_a_sample_is_quarantined_and_skipped():
    run_ok("worker_deaths.segfault_quarantined", timeout=60)


def test_poison_sample_without_skip_raises_naming_it():
    run_ok("worker_deaths.poison_sample_raises", timeout=60)


def test_restart_budget_raises_with_history():
    run_ok("worker_deaths.restart_budget_raises", timeout=60)


def test_exit_code_names_last_stderr_lines():
    run_ok("worker_deaths.exit_code_names_stderr", timeout=60)


def test_quarantining_the_last_task_in_flight_does_not_hang():
    run_ok("worker_deaths.last_task_quarantined", timeout=60)


def test_persistent_worker_killed_between_epochs():
    run_ok("worker_deaths.persistent_worker_killed_between_epochs", timeout=60)
