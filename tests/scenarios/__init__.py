"""Scenarios that run in a fresh interpreter of their own: functions in real modules, called by
name from a test (``conftest.run_scenario("worker_deaths.repeated_sigkill", ...)``), so that the
linter reads them, an editor jumps into them and two tests can share one.

A scenario is a plain function with JSON-able arguments. It asserts what it checks and prints
what the calling test reads (by convention "OK" at the end); it runs with ``tests/`` as its
working directory and on ``PYTHONPATH`` (``scenario_datasets`` and friends import as usual).
"""
