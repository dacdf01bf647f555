"""Running the framework scripts (tests/frameworks/) for real: `run` starts one in a fresh
interpreter with tests/ on its path and offline Hugging Face settings, `needs` skips a test whose
library is not installed, `reports` reads what ranks wrote."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
SCRIPTS = os.path.join(HERE, "frameworks")


def needs(*modules):
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    return pytest.mark.skipif(
        bool(missing), reason=f"{', '.join(missing)} not installed (make test installs it from "
        "tests/requirements-frameworks.txt)")


def run(args, tmp_path, timeout=300, env=None):
    full = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [HERE, os.environ.get("PYTHONPATH", "")]), PYTHONFAULTHANDLER="1",
        TOKENIZERS_PARALLELISM="false", HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1",
        HF_HOME=str(tmp_path / "hf"), **(env or {}))
    try:
        r = subprocess.run([sys.executable, *args], cwd=tmp_path, env=full, capture_output=True,
                           text=True, timeout=timeout, start_new_session=True)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"hung for {timeout}s\n{e.stdout}\n{e.stderr}")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    assert "leaked semaphore" not in r.stderr, r.stderr[-3000:]
    return r


def reports(prefix) -> list[dict]:
    return [json.load(open(p)) for p in sorted(glob.glob(f"{prefix}.*"))]
