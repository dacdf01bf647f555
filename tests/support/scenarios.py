"""Running a scenario (a function of ``tests/scenarios/``) in a fresh interpreter, with a hard
time bound, and judging how it ended.

The runner (``python -m scenarios``) prints "OK" as its last line only once the scenario's
function has returned, so a test that passes saw every check of the scenario pass:
``run_ok(name, ...)`` runs one and asserts exactly that (exit code 0 and "OK" last), and
``expect_failure(r, *texts)`` asserts that one failed, saying what. Each assertion's message
holds the command and its stdout and stderr."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/

# What of a scenario's output an assertion's message shows (its end, where the error is).
_SHOWN = 12000


def scenario_command(name: str, *args, kwargs: dict | None = None) -> list[str]:
    """The command line that runs scenario `name` with JSON-able `args` and `kwargs` (for a
    test that needs the process itself: Popen, its output line by line, a signal)."""
    return [sys.executable, "-m", "scenarios", name,
            json.dumps({"args": list(args), "kwargs": kwargs or {}})]


def scenario_env(env: dict | None = None) -> dict:
    """The environment a scenario runs in: ours with tests/ on PYTHONPATH, updated with `env`."""
    full = dict(os.environ)
    full["PYTHONPATH"] = HERE + os.pathsep + full.get("PYTHONPATH", "")
    full.update(env or {})
    return full


def run_scenario(name: str, *args, timeout: float = 60, env: dict | None = None, wrapper=None,
                 kwargs: dict | None = None) -> subprocess.CompletedProcess:
    """Runs scenario `name` ("module.function" in ``tests/scenarios/``) with JSON-able `args`
    in a fresh interpreter (cwd = tests/), returns CompletedProcess, whatever its end: judge it
    with `expect_ok` or `expect_failure` (or call `run_ok`). A hang is a failure: the process
    group is killed at `timeout`."""
    # what the scenario puts in the temp directory (its marks folders, say) is removed with it
    temp = tempfile.mkdtemp(prefix="stoker-scenario-")
    full_env = scenario_env({"PYTHONFAULTHANDLER": "1", "TMPDIR": temp, **(env or {})})
    cmd = scenario_command(name, *args, kwargs=kwargs)
    if wrapper:
        cmd = wrapper + cmd
    if os.environ.get("STOKER_TEST_TIMEOUT_S") == "0":
        timeout = None  # under tests/sanitize_extension.sh: its watch examines a hang
    try:
        return subprocess.run(cmd, cwd=HERE, env=full_env, capture_output=True, text=True,
                              timeout=timeout, start_new_session=True)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"scenario {name} hung for {timeout}s\n"
                    f"{_output(_text(e.stdout), _text(e.stderr))}")
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def run_ok(name: str, *args, **kw) -> subprocess.CompletedProcess:
    """`run_scenario`, then `expect_ok`: the scenario ran to its end. Returns the
    CompletedProcess, for the test's further checks of its output."""
    return expect_ok(run_scenario(name, *args, **kw))


def expect_ok(r: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """Asserts that the scenario run `r` ended well: exit code 0 and "OK" as the last line of
    its stdout (which the runner prints once the scenario's function has returned). Returns `r`."""
    last = last_line(r.stdout)
    if r.returncode != 0 or last != "OK":
        raise AssertionError(
            f"scenario did not end with OK: exit code {r.returncode}, last line of stdout "
            f"{last!r}, of stderr {last_line(r.stderr)!r}\ncommand: {_command(r)}\n"
            f"{_output(r.stdout, r.stderr)}")
    return r


def expect_failure(r: subprocess.CompletedProcess, *texts: str) -> subprocess.CompletedProcess:
    """Asserts that the scenario run `r` failed (a nonzero exit code) and that each of `texts`
    is in its stderr or stdout. Returns `r`."""
    out = (r.stdout or "") + (r.stderr or "")
    missing = [t for t in texts if t not in out]
    if r.returncode == 0 or missing:
        what = (f"exit code {r.returncode}, expected a failure" if r.returncode == 0
                else f"exit code {r.returncode}, but its output lacks {missing!r}")
        raise AssertionError(f"scenario did not fail as expected: {what}\n"
                             f"command: {_command(r)}\n{_output(r.stdout, r.stderr)}")
    return r


def completed(proc: subprocess.Popen, stdout: str | None, stderr: str | None
              ) -> subprocess.CompletedProcess:
    """A Popen that has ended, with the output read from it, as a CompletedProcess (for
    `expect_ok` and `expect_failure`)."""
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout or "", stderr or "")


def last_line(text: str | None) -> str | None:
    """The last line of `text` that is not blank, stripped; None when there is none."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else None


def _text(out) -> str:
    if isinstance(out, bytes):
        return out.decode(errors="replace")
    return out or ""


def _command(r) -> str:
    args = r.args
    return " ".join(args) if isinstance(args, (list, tuple)) else str(args)


def _output(stdout: str | None, stderr: str | None) -> str:
    def tail(text):
        text = text or ""
        return text if len(text) <= _SHOWN else f"[... {len(text) - _SHOWN} chars before]" \
            + text[-_SHOWN:]
    return f"--- stdout ---\n{tail(stdout)}\n--- stderr ---\n{tail(stderr)}"


def start_running_loader(context=None):
    """A child process iterating a slow loader (its own session, so a test can signal the group):
    scenario ``running_loader.slow_epoch``. Returns (Popen, worker pids) once a batch from each
    worker has arrived. The test ends it (a signal): it never ends with OK."""
    proc = subprocess.Popen(scenario_command("running_loader.slow_epoch", context),
                            cwd=HERE, env=scenario_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    line = proc.stdout.readline()
    assert line.startswith("PIDS"), line + proc.stderr.read()
    return proc, [int(x) for x in line.split()[1:]]
