"""Shared helpers: run a scenario in its own subprocess with a hard time bound."""

from __future__ import annotations

import importlib.util
import json
import multiprocessing.util
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

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


def scenario_command(name: str, *args, kwargs: dict | None = None) -> list[str]:
    """The command line that runs scenario `name` with JSON-able `args` and `kwargs` (for a
    test that needs the process itself: Popen, its output line by line, a signal)."""
    return [sys.executable, "-m", "scenarios", name,
            json.dumps({"args": list(args), "kwargs": kwargs or {}})]


def run_scenario(name: str, *args, timeout: float = 60, env: dict | None = None, wrapper=None,
                 kwargs: dict | None = None):
    """Runs scenario `name` ("module.function" in ``tests/scenarios/``) with JSON-able `args`
    in a fresh interpreter (cwd = tests/), returns CompletedProcess. A hang is a failure: the
    process group is killed at `timeout`."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = HERE + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env["PYTHONFAULTHANDLER"] = "1"
    # what the scenario puts in the temp directory (its marks folders, say) is removed with it
    temp = tempfile.mkdtemp(prefix="stoker-scenario-")
    full_env["TMPDIR"] = temp
    if env:
        full_env.update(env)
    cmd = scenario_command(name, *args, kwargs=kwargs)
    if wrapper:
        cmd = wrapper + cmd
    if os.environ.get("STOKER_TEST_TIMEOUT_S") == "0":
        timeout = None  # under tests/sanitize_extension.sh: its watch examines a hang
    try:
        return subprocess.run(cmd, cwd=HERE, env=full_env, capture_output=True, text=True,
                              timeout=timeout, start_new_session=True)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"scenario {name} hung for {timeout}s\nstdout:\n{e.stdout}\n"
                    f"stderr:\n{e.stderr}")
    finally:
        shutil.rmtree(temp, ignore_errors=True)


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
    return run_scenario


def start_running_loader(context=None):
    """A child process iterating a slow loader (its own session, so a test can signal the group):
    scenario ``running_loader.slow_epoch``. Returns (Popen, worker pids) once the first batch
    has arrived."""
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(scenario_command("running_loader.slow_epoch", context),
                            cwd=HERE, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    line = proc.stdout.readline()
    assert line.startswith("PIDS"), line + proc.stderr.read()
    return proc, [int(x) for x in line.split()[1:]]


def write_file(path: str, text: str) -> None:
    """Writes `text` to `path`, making its folders (fake /proc and /sys trees)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


@pytest.fixture
def cgroup_tree(tmp_path, monkeypatch):
    """An empty fake /proc and cgroup tree that stoker's _cgroup reads instead of the real one."""
    from stoker import _system as _cgroup

    monkeypatch.setattr(_cgroup, "_PROC", str(tmp_path / "proc"))
    monkeypatch.setattr(_cgroup, "_V2_ROOT", str(tmp_path / "cg"))
    monkeypatch.setattr(_cgroup, "_V1_ROOT", str(tmp_path / "cg" / "memory"))
    return tmp_path


# tests/vision needs torchvision (and what imports it: Mosaic's streaming, timm), whose PyPI
# builds need torch 2.14.1: `make test-vision` runs them in their own venv (.venv-vision).
collect_ignore = [] if importlib.util.find_spec("torchvision") else ["vision"]
# tests/ray starts a Ray cluster: only inside the loopback-only namespace tests/test_ray.py makes.
if os.environ.get("STOKER_RAY_NETNS") != "1":
    collect_ignore.append("ray")
