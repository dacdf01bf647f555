"""tests/sanitize_watch.py, the hang watch of `make sanitize-extension`: a hang whose waiting
thread makes its system call from inside libasan's own code is told from any other (a stoker
hang fails the run; only libasan's fork deadlock is run again)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import sanitize_watch  # noqa: E402


def _libasan():
    try:
        path = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True,
                              text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return os.path.realpath(path) if path and os.path.isabs(path) and os.path.exists(path) \
        else None


# A process that waits inside libasan: an ASan report, then libasan's own sleep before it dies.
IN_ASAN = ("import ctypes; b = ctypes.create_string_buffer(1000); "
           "ctypes.string_at(ctypes.addressof(b) + 1000, 64)")


def test_a_hang_elsewhere_fails_at_once(tmp_path):
    log = tmp_path / "log"
    status = sanitize_watch.main([str(log), "3", "--", sys.executable, "-c",
                                  "import threading; print('x', flush=True); "
                                  "threading.Event().wait(60)"])
    text = log.read_text()
    assert status == 124 and "hung elsewhere" in text and "running it again" not in text, text


def test_a_command_that_ends_gives_its_status(tmp_path):
    log = tmp_path / "log"
    assert sanitize_watch.main([str(log), "30", "--", sys.executable, "-c",
                                "import sys; print('ok'); sys.exit(3)"]) == 3
    assert "ok" in log.read_text()


@pytest.mark.skipif(_libasan() is None, reason="no libasan (gcc's ASan runtime) here")
def test_a_hang_inside_libasan_is_run_again(tmp_path, monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", _libasan())
    monkeypatch.setenv("ASAN_OPTIONS", "detect_leaks=0:sleep_before_dying=60")
    log = tmp_path / "log"
    monkeypatch.setattr(sanitize_watch, "ATTEMPTS", 2)
    status = sanitize_watch.main([str(log), "3", "--", sys.executable, "-c", IN_ASAN])
    text = log.read_text()
    assert status == 124, text
    assert text.count("hung inside libasan") == 2 and "running it again" in text, text
    assert "2 times in a row: failing" in text


@pytest.mark.skipif(_libasan() is None, reason="no libasan (gcc's ASan runtime) here")
def test_a_hang_in_a_process_of_its_own_session_is_found(tmp_path, monkeypatch):
    """A scenario a test starts in a session of its own (conftest.run_scenario) is examined
    too: the watch looks at the command's descendants, not only its session."""
    monkeypatch.setenv("LD_PRELOAD", _libasan())
    monkeypatch.setenv("ASAN_OPTIONS", "detect_leaks=0:sleep_before_dying=60")
    monkeypatch.setattr(sanitize_watch, "ATTEMPTS", 1)
    log = tmp_path / "log"
    inner = (f"import subprocess, sys; subprocess.run([sys.executable, '-c', {IN_ASAN!r}], "
             "start_new_session=True)")
    status = sanitize_watch.main([str(log), "3", "--", sys.executable, "-c", inner])
    text = log.read_text()
    assert status == 124 and "hung inside libasan" in text, text
