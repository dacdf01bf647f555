"""Workers that die while they start: a signal (the OOM killer, an operator, a fault in native
code) is survived within max_restarts; a start-up that raises is not retried; a worker killed at
every start is named with its history. Scenarios: tests/scenarios/startup_deaths.py."""

from __future__ import annotations

import pytest

from support.scenarios import run_ok


@pytest.mark.parametrize("context,sig", [("fork", "SIGKILL"), ("fork", "SIGSEGV"),
                                         ("spawn", "SIGKILL"), ("spawn", "SIGSEGV")])
def test_killed_while_starting_is_restarted_and_nothing_is_lost(context, sig):
    r = run_ok("startup_deaths.killed_at_start_is_restarted", context, sig, timeout=120)
    assert r.stderr.count("restarted it") == 2, r.stderr


def test_persistent_workers_killed_while_starting():
    run_ok("startup_deaths.killed_at_start_is_restarted", "spawn", "SIGKILL", True,
           timeout=120)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_killed_at_every_start_ends_with_its_history(context):
    run_ok("startup_deaths.killed_at_every_start_names_the_history", context,
           timeout=120)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_raise_policy_names_a_kill_while_starting(context):
    run_ok("startup_deaths.raise_policy_names_a_start_up_kill", context, timeout=90)


def test_a_start_up_that_raises_ends_the_run_at_once():
    r = run_ok("startup_deaths.start_up_that_raises_ends_at_once", timeout=90)
    assert "cannot open the index of shard 0" in r.stderr, r.stderr  # its traceback
    assert "restarted it" not in r.stderr, r.stderr


def test_a_worker_init_fn_that_raises_ends_the_run_at_once():
    r = run_ok("startup_deaths.init_fn_that_raises_ends_at_once", timeout=90)
    assert "restarted it" not in r.stderr, r.stderr
