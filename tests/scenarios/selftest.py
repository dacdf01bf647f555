"""The runner's own checks (tests/test_scenarios.py)."""

from __future__ import annotations

from scenarios import expect_raises


def echo(a, b=0):
    import scenario_datasets  # noqa: F401  (tests/ is on the path)

    print("ECHO", a, b)


def fails_after_printing_ok():
    """Prints "OK" itself, as scenarios once did, then fails a check: the run is a failure."""
    print("OK", flush=True)
    raise AssertionError("a check after the scenario's own OK")


def expects_an_error_that_never_comes(match=None):
    """Expects a ValueError from a block that raises nothing (or, with `match`, one whose
    message does not match): the scenario fails, naming what it expected."""
    with expect_raises(ValueError, match=match):
        if match:
            raise ValueError("something else went wrong")


def expects_an_error_that_comes():
    """Expects a ValueError, and gets it: the scenario passes with the error checked."""
    with expect_raises(ValueError, match="sample 13") as raised:
        raise ValueError("cannot decode sample 13")
    assert raised.value.__traceback__ is None  # kept without the frames it held
    assert str(raised.value) == "cannot decode sample 13", raised.value


def another_error_than_the_expected_one():
    """Expects a ValueError, gets a KeyError: that error ends the scenario as it came."""
    with expect_raises(ValueError):
        raise KeyError("index 7")
