"""The scenario runner: a function of tests/scenarios called by name in a fresh interpreter."""


def test_a_scenario_runs_by_name_with_its_arguments(scenario):
    r = scenario("selftest.echo", [1, "x"], kwargs={"b": 2}, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "ECHO [1, 'x'] 2" in r.stdout, r.stdout + r.stderr


def test_a_failing_scenario_fails_its_process(scenario):
    r = scenario("selftest.echo", timeout=60)  # a missing argument: TypeError
    assert r.returncode != 0 and "TypeError" in r.stderr, r.stderr
