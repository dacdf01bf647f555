"""Shared fixtures: the suite's temp directory and what each test leaves in it, scenarios
(support/scenarios.py runs them), fake /proc and cgroup trees."""

from __future__ import annotations

import importlib.util
import multiprocessing.util
import os
import shutil
import tempfile

import pytest

# Running scenarios: support/scenarios.py (imported from here too, as tests have done).
from support.scenarios import (  # noqa: F401
    HERE,
    expect_failure,
    expect_ok,
    run_ok,
    run_scenario,
    scenario_command,
    start_running_loader,
)

# The tiers (unit, scenario, system) as markers, and the unit tier's guard: support/tiers.py.
pytest_plugins = ["support.tiers"]

# The suite's own temp directory, for it and every process it starts, removed at its end: what a
# test leaves there is seen by the fixture below, whatever else on the machine uses /tmp (another
# checkout's suite), and nothing is left in /tmp after the run.
# A process the suite started that imports this file (a spawned worker unpickling a function of
# a test module imports that module) uses the suite's folder: it makes and removes none.
SESSION_TEMP = os.environ.get("STOKER_TEST_SESSION_TEMP", "")
if not os.path.isdir(SESSION_TEMP):
    SESSION_TEMP = tempfile.mkdtemp(prefix="stoker-tests-")
    os.environ["STOKER_TEST_SESSION_TEMP"] = SESSION_TEMP
    # Removed at this process's exit, after multiprocessing removed its own folder in it (its
    # finalizer has exitpriority -100; lower runs later), so neither finds the other's gone.
    multiprocessing.util.Finalize(None, shutil.rmtree, args=(SESSION_TEMP,),
                                  kwargs={"ignore_errors": True}, exitpriority=-101)
os.environ["TMPDIR"] = SESSION_TEMP
tempfile.tempdir = None  # gettempdir() reads TMPDIR again


def _stoker_temp_entries() -> set:
    try:
        return {e for e in os.listdir(tempfile.gettempdir()) if e.startswith("stoker-")}
    except OSError:
        return set()


@pytest.fixture(autouse=True)
def _leaves_no_temp_folder():
    """Every test leaves the temp directory as it found it: no stoker-* folder of its own (a
    Ray node's temp dir, a mount namespace's stash, a scenario's) outlives it."""
    before = _stoker_temp_entries()
    yield
    left = sorted(_stoker_temp_entries() - before)
    assert not left, f"the test left {left} in {tempfile.gettempdir()}"


@pytest.fixture
def scenario():
    """`run_scenario`, which returns the run however it ended: a test judges it with
    `expect_ok` or `expect_failure` (support/scenarios.py), or calls `run_ok` instead."""
    return run_scenario


def write_file(path: str, text: str) -> None:
    """Writes `text` to `path`, making its folders (fake /proc and /sys trees)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


@pytest.fixture
def cgroup_tree(tmp_path, monkeypatch):
    """An empty fake /proc and cgroup tree that stoker's _cgroup reads instead of the real one."""
    from stoker.common import system as _cgroup

    monkeypatch.setattr(_cgroup, "_PROC", str(tmp_path / "proc"))
    monkeypatch.setattr(_cgroup, "_V2_ROOT", str(tmp_path / "cg"))
    monkeypatch.setattr(_cgroup, "_V1_ROOT", str(tmp_path / "cg" / "memory"))
    return tmp_path


# tests/vision needs torchvision (and what imports it: Mosaic's streaming, timm), whose PyPI
# builds need torch 2.14.1: `make test-vision` runs them in their own venv (.venv-vision).
collect_ignore = [] if importlib.util.find_spec("torchvision") else ["vision"]
# tests/placements/ray/cluster starts a Ray cluster: only inside the loopback-only namespace
# tests/placements/ray/test_ray.py makes.
if os.environ.get("STOKER_RAY_NETNS") != "1":
    collect_ignore.append("placements/ray/cluster")
