"""Scenarios that run in a fresh interpreter of their own: functions in real modules, called by
name from a test (``support.scenarios.run_ok("worker_deaths.repeated_sigkill", ...)``), so that
the linter reads them, an editor jumps into them and two tests can share one.

A scenario is a plain function with JSON-able arguments. It asserts what it checks, and prints
only what the calling test reads besides ("PIDS ...", "HELD ..."): the runner
(``__main__``) prints "OK" once the function has returned, so every check a scenario makes
must be made before it returns. An error a scenario expects is checked with `expect_raises`,
which fails the scenario when the error does not come. It runs with ``tests/`` as its working
directory and on ``PYTHONPATH`` (``scenario_datasets`` and friends import as usual).

This module imports nothing but the standard library (a scenario of its package runs where
torch cannot be imported).
"""

from __future__ import annotations

import re


class expect_raises:  # noqa: N801  (used as a context manager, named as pytest.raises is)
    """``with expect_raises(ValueError, match="index 13") as raised: ...``: the block must raise
    one of the `types` (its message matching the regular expression `match`, when given), which
    is kept as ``raised.value`` for further checks; a block that raises nothing fails with
    AssertionError, and an exception of another type goes on as it was.

    The exception is kept without its traceback (and those of its cause and context): the
    frames it holds would keep a loader's iterator, and its workers, alive after the block."""

    def __init__(self, *types: type[BaseException], match: str | None = None):
        if not types:
            raise TypeError("expect_raises needs an exception type")
        self.types = types
        self.match = match
        self.value: BaseException | None = None

    def _names(self) -> str:
        return " or ".join(t.__name__ for t in self.types)

    def __enter__(self) -> expect_raises:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is None:
            raise AssertionError(f"expected {self._names()}, none was raised")
        if not isinstance(exc, self.types):
            return False
        if self.match is not None and not re.search(self.match, str(exc)):
            raise AssertionError(f"expected {self._names()} matching {self.match!r}, got "
                                 f"{type(exc).__name__}: {exc}") from exc
        seen = set()
        todo: list[BaseException | None] = [exc]
        while todo:
            e = todo.pop()
            if e is None or id(e) in seen:
                continue
            seen.add(id(e))
            e.__traceback__ = None
            todo += [e.__cause__, e.__context__]
        self.value = exc
        return True
