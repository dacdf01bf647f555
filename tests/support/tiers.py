"""The suite's tiers, as pytest markers (a plugin the root conftest loads):

- ``unit``: no process is started (torch only where needed); ``make test-quick`` runs them, in
  well under a minute. A test says so itself (``@pytest.mark.unit``, or a module's
  ``pytestmark``), and the tier is kept honest: a unit test that starts a process (fork,
  spawn, a subprocess, a multiprocessing start) fails with ``StartedAProcess``.
- ``system``: frameworks, Ray clusters, the benches, the soak, the vision venv: the modules in
  SYSTEM, marked here.
- ``scenario``: everything else: real workers, scenarios in a fresh interpreter.

``make test`` runs every tier, as CI does. Every test also has a time bound (pytest-timeout:
``timeout`` in pyproject.toml; a test that needs more says ``@pytest.mark.timeout(N)``), so a
hang in the test's own process fails that test instead of eating CI's run;
``STOKER_TEST_TIMEOUT_S=0`` (tests/sanitize_extension.sh, whose watch examines hangs) lifts it.
"""

from __future__ import annotations

import multiprocessing.forkserver
import multiprocessing.util
import os
import subprocess

import pytest

# Modules (paths under tests/) of the system tier.
SYSTEM = (
    "loader/integrations/test_frameworks.py",
    "placements/ray/test_ray.py",
    "tools/test_bench.py",
    "test_soak.py",
    "test_demo.py",
    "loader/resume/test_with_frameworks.py",
    "vision/",
    "placements/ray/cluster/",
)

TIERS = ("unit", "scenario", "system")
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class StartedAProcess(RuntimeError):
    """A test of the unit tier started a process."""


_started: list[str] = []  # what the running unit test tried to start (an `except` may hide it)


def _refuse(*args, **kwargs):
    _started.append(repr(args[:2]))
    raise StartedAProcess("a test marked unit started a process: leave it unmarked (the "
                          "scenario tier) or give it a fake")


def tier_of(item) -> str:
    rel = os.path.relpath(str(item.path), HERE).replace(os.sep, "/")
    if item.get_closest_marker("unit") is not None:
        return "unit"
    if item.get_closest_marker("system") is not None:
        return "system"
    if any(rel == m or (m.endswith("/") and rel.startswith(m)) for m in SYSTEM):
        return "system"
    return "scenario"


def pytest_configure(config):
    for tier, what in (("unit", "no process is started (make test-quick)"),
                       ("scenario", "real worker processes, scenarios in fresh interpreters"),
                       ("system", "frameworks, Ray, benches, the soak, the vision venv")):
        config.addinivalue_line("markers", f"{tier}: {what}")


@pytest.hookimpl(tryfirst=True)  # (before -m deselects by the markers it adds)
def pytest_collection_modifyitems(config, items):
    lift = os.environ.get("STOKER_TEST_TIMEOUT_S") == "0"
    for item in items:
        tier = tier_of(item)
        if item.get_closest_marker(tier) is None:
            item.add_marker(getattr(pytest.mark, tier))
        if lift:  # the closest timeout marker wins: this one, before the test's own
            item.add_marker(pytest.mark.timeout(0), append=False)


@pytest.fixture(autouse=True)
def _unit_starts_no_process(request, monkeypatch):
    if request.node.get_closest_marker("unit") is None:
        yield
        return
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "spawnv", "spawnve",
                 "system"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, _refuse)
    monkeypatch.setattr(subprocess.Popen, "_execute_child", _refuse)
    monkeypatch.setattr(multiprocessing.util, "spawnv_passfds", _refuse)
    # a fork server an earlier test started forks without any call above in this process
    monkeypatch.setattr(multiprocessing.forkserver.ForkServer, "connect_to_new_process",
                        _refuse)
    monkeypatch.setattr(multiprocessing.forkserver, "connect_to_new_process", _refuse)
    _started.clear()
    yield
    assert not _started, f"a unit test started a process: {_started}"
