"""The `stoker` command itself: what a newcomer typing `stoker`, `stoker -h` or `stoker --help`
sees (the commands, a line each), and how it exits."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

COMMANDS = ("run", "bench", "top", "doctor")


def _stoker(*args):
    # the installed console script where there is one (what a user types), else -m stoker
    script = os.path.join(os.path.dirname(sys.executable), "stoker")
    cmd = [script] if os.access(script, os.X_OK) else [sys.executable, "-m", "stoker"]
    return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=60)


def _lists_every_command(text: str) -> None:
    lines = text.splitlines()
    assert lines[0].startswith("usage: stoker"), text
    for name in COMMANDS:
        line = [ln for ln in lines if ln.split()[:1] == [name]]
        assert len(line) == 1 and len(line[0].split()) > 3, (name, text)  # a line that says


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_lists_the_commands_and_succeeds(flag):
    r = _stoker(flag)
    assert r.returncode == 0, r.stderr
    _lists_every_command(r.stdout)


def test_no_command_lists_them_and_exits_2():
    r = _stoker()
    assert r.returncode == 2 and r.stdout == ""
    _lists_every_command(r.stderr)


def test_an_unknown_command_is_named():
    r = _stoker("trian")
    assert r.returncode == 2
    assert r.stderr.startswith("stoker: no command 'trian'"), r.stderr
    _lists_every_command(r.stderr.split("\n", 1)[1])


def test_version():
    import stoker

    r = _stoker("--version")
    assert (r.returncode, r.stdout.strip()) == (0, f"stoker {stoker.__version__}")
