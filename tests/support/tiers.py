"""The suite's tiers, as pytest markers (a plugin the root conftest loads):

- ``unit``: no process is started (torch only where needed); ``make test-quick`` runs them, in
  well under a minute. A test says so itself (``@pytest.mark.unit``, or a module's
  ``pytestmark``), and the tier is kept honest: a unit test that starts a process (fork,
  spawn, a subprocess, a multiprocessing start) fails with ``StartedAProcess``.
- ``system``: frameworks, Ray clusters, the benches, the soak, the vision venv: the modules in
  SYSTEM, marked here.
- ``scenario``: everything else: real workers, scenarios in a fresh interpreter.

Beside the tiers, ``free_threading`` marks the tests of FREE_THREADING (modules or folders under
tests/): the free-threaded leg, ``make test-ft FT_PYTHON=/path/to/python3.14t`` (docs/develop.md),
runs them on a free-threaded Python, which no registry serves and CI therefore lacks. They are
the thread, fault, start-method and binding tests, which run on every Python too (the tests of
the free-threaded path itself skip where there is a GIL). ``python tests/support/tiers.py
free-threading`` prints their paths (the Makefile's list).

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

# The free-threaded leg (make test-ft): threads hammering the bindings, the GIL's state and the
# module that turns it on, threads_per_worker, worker deaths, hangs and errors, descriptors,
# lifecycle and OOM kills under 3.14's default start method (forkserver), threads and forks, each
# start method, loads-once, SharedList. A system module here is still left out.
FREE_THREADING = (
    "test_bindings_under_threads.py",
    "test_free_threading.py",
    "common/test_gil.py",
    "tools/test_doctor_gil.py",
    "worker/test_threads.py",
    "worker/test_gate_mutants.py",
    "worker/test_loads_once.py",
    "loader/test_errors.py",
    "loader/test_resources.py",
    "loader/iterators/test_lifecycle.py",
    "loader/iterators/test_oom.py",
    "loader/iterators/test_threads_and_forks.py",
    "loader/iterators/test_worker_deaths.py",
    "loader/iterators/test_startup_deaths.py",
    "loader/iterators/test_hangs_and_errors.py",
    "wire/test_spawn_start.py",
    "datasets/test_shared_list.py",
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


def in_free_threading_leg(item) -> bool:
    rel = os.path.relpath(str(item.path), HERE).replace(os.sep, "/")
    return any(rel == m or (m.endswith("/") and rel.startswith(m)) for m in FREE_THREADING)


def pytest_configure(config):
    config.addinivalue_line("markers", "free_threading: the free-threaded leg runs it "
                            "(make test-ft; FREE_THREADING in tests/support/tiers.py)")
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
        if in_free_threading_leg(item) and item.get_closest_marker("free_threading") is None:
            item.add_marker(pytest.mark.free_threading)
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


if __name__ == "__main__":  # python tests/support/tiers.py free-threading: the leg's paths
    import sys

    if sys.argv[1:] != ["free-threading"]:
        raise SystemExit("usage: python tests/support/tiers.py free-threading")
    print(" ".join(os.path.join("tests", m) for m in FREE_THREADING))
