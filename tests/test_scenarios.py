"""The scenario runner: a function of tests/scenarios called by name in a fresh interpreter,
"OK" printed by the runner once it has returned, and the helpers that judge a run."""

from __future__ import annotations

import subprocess

import pytest

from support.scenarios import expect_failure, expect_ok, run_ok, run_scenario


def test_a_scenario_runs_by_name_with_its_arguments():
    r = run_ok("selftest.echo", [1, "x"], kwargs={"b": 2}, timeout=60)
    assert "ECHO [1, 'x'] 2" in r.stdout, r.stdout + r.stderr
    assert r.stdout.splitlines()[-1] == "OK", r.stdout  # the runner's, after the scenario's


def test_a_failing_scenario_fails_its_process():
    r = run_scenario("selftest.echo", timeout=60)  # a missing argument: TypeError
    expect_failure(r, "TypeError")
    assert "OK" not in r.stdout.split(), r.stdout


def test_a_scenario_that_fails_after_printing_ok_is_a_failure():
    r = run_scenario("selftest.fails_after_printing_ok", timeout=60)
    expect_failure(r, "a check after the scenario's own OK")
    with pytest.raises(AssertionError, match="exit code 1"):
        expect_ok(r)


def test_an_expected_error_that_never_comes_fails_the_scenario():
    expect_failure(run_scenario("selftest.expects_an_error_that_never_comes", timeout=60),
                   "expected ValueError, none was raised")
    expect_failure(run_scenario("selftest.expects_an_error_that_never_comes", "sample 13",
                                timeout=60),
                   "expected ValueError matching 'sample 13', got ValueError: something else")
    expect_failure(run_scenario("selftest.another_error_than_the_expected_one", timeout=60),
                   "KeyError: 'index 7'")
    run_ok("selftest.expects_an_error_that_comes", timeout=60)


@pytest.mark.unit
@pytest.mark.parametrize("returncode,stdout", [
    (0, "ECHO 1\n"),             # ended well, but not through the runner's end
    (0, "OK\nPIDS 1 2\n"),       # something printed after the OK
    (0, ""),
    (1, "OK\n"),                 # the OK of a scenario that failed at exit
    (-9, "OK\n"),
])
def test_expect_ok_asks_for_exit_code_0_and_ok_last(returncode, stdout):
    r = subprocess.CompletedProcess(["python", "-m", "scenarios", "x.y"], returncode, stdout,
                                    "what stderr said")
    with pytest.raises(AssertionError) as e:
        expect_ok(r)
    # the message holds the command and both outputs
    assert "python -m scenarios x.y" in str(e.value) and "what stderr said" in str(e.value)
    assert f"exit code {returncode}" in str(e.value)
    assert expect_ok(subprocess.CompletedProcess(r.args, 0, stdout + "OK\n\n", "")).returncode == 0


@pytest.mark.unit
def test_expect_failure_asks_for_a_nonzero_exit_code_and_each_text():
    r = subprocess.CompletedProcess(["x"], 1, "out: one\n", "err: two\n")
    expect_failure(r, "one", "two")
    with pytest.raises(AssertionError, match="lacks \\['three'\\]"):
        expect_failure(r, "one", "three")
    with pytest.raises(AssertionError, match="expected a failure"):
        expect_failure(subprocess.CompletedProcess(["x"], 0, "one\nOK\n", ""), "one")
