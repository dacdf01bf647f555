"""The runner's own check (tests/test_scenarios.py)."""

from __future__ import annotations


def echo(a, b=0):
    import scenario_datasets  # noqa: F401  (tests/ is on the path)

    print("ECHO", a, b)
