"""pytest plugin for run.py: a time bound per test, and a journal of every test's outcome.

Loaded with ``-p suite_plugin`` (run.py puts this directory on PYTHONPATH). pytest-timeout is not
needed: each test gets SIGALRM after TORCH_SUITE_TIMEOUT seconds, whose handler raises in the main
thread, so a test blocked in Python code (or in a system call that returns EINTR) fails with a
message that names the bound. A test stuck where no Python code runs (a C++ wait that ignores
signals, a deadlock holding the GIL) cannot be interrupted that way, so faulthandler also ends the
whole pytest process 30 s later, after printing every thread's stack; run.py then records that test
as timed out and starts pytest again on the tests still to run.

The journal (TORCH_SUITE_JOURNAL, JSON lines, appended and flushed per line) survives such a hard
stop: a "start" line before each test and a "report" line per phase (setup, call, teardown).
"""

import faulthandler
import json
import os
import signal
import sys

import pytest

_TIMEOUT = float(os.environ.get("TORCH_SUITE_TIMEOUT", "60"))
_SLOW_TIMEOUT = float(os.environ.get("TORCH_SUITE_SLOW_TIMEOUT", str(_TIMEOUT)))
_SLOW_TESTS = tuple(filter(None, os.environ.get("TORCH_SUITE_SLOW_TESTS", "").split(",")))
_JOURNAL = os.environ.get("TORCH_SUITE_JOURNAL")
_HARD_GRACE = 30.0


class TestTimeout(Exception):
    """The test ran past its per-test time bound."""

    __test__ = False  # not a test class, despite the name


def _write(record):
    if not _JOURNAL:
        return
    with open(_JOURNAL, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()


def _bound_for(item):
    return _SLOW_TIMEOUT if item.name.startswith(_SLOW_TESTS or ("\0",)) else _TIMEOUT


def _one_line(report):
    """The first line of what went wrong (or of the skip reason)."""
    rep = report.longrepr
    if rep is None:
        return ""
    if isinstance(rep, tuple):  # a skip: (path, lineno, reason)
        text = str(rep[2])
    else:
        crash = getattr(rep, "reprcrash", None)
        text = crash.message if crash is not None else str(rep)
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:400]
    return ""


def pytest_collection_finish(session):
    # Say which DataLoader the test module really sees, so a run where the substitution did not
    # take effect cannot pass for a stoker run.
    seen = set()
    for item in session.items:
        module = getattr(item, "module", None)
        if module is not None and module.__name__ not in seen:
            seen.add(module.__name__)
            dl = getattr(module, "DataLoader", None)
            import torch.utils.data

            tdl = torch.utils.data.DataLoader
            _write({
                "event": "session",
                "module": module.__name__,
                "module_DataLoader": f"{dl.__module__}.{dl.__qualname__}" if dl else None,
                "torch_utils_data_DataLoader": f"{tdl.__module__}.{tdl.__qualname__}",
                "collected": len(session.items),
            })


_current_bound = _TIMEOUT


def _on_alarm(signum, frame):
    raise TestTimeout(f"TIMEOUT: the test ran past its per-test bound of {_current_bound:g} s")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _current_bound
    bound = _current_bound = _bound_for(item)
    _write({"event": "start", "nodeid": item.nodeid, "bound_s": bound})
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, bound)
    faulthandler.dump_traceback_later(bound + _HARD_GRACE, exit=True, file=sys.__stderr__)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGALRM, previous)


def pytest_runtest_logreport(report):
    _write({
        "event": "report",
        "nodeid": report.nodeid,
        "when": report.when,
        "outcome": report.outcome,
        "wasxfail": hasattr(report, "wasxfail"),
        "message": _one_line(report),
        "duration_s": round(report.duration, 3),
    })
