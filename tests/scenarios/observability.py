"""Scenarios of tests/loader/iterators/test_observability.py: the data-stall notice (logging set up from the
start) and stoker doctor on a private, small /dev/shm, each in a fresh process."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time

import torch

import stoker
from scenario_datasets import Slow


class Computes(Slow):
    """20 ms of CPU per sample (a decoder in Python)."""

    def __getitem__(self, i):
        end = time.thread_time() + 0.02
        while time.thread_time() < end:
            pass
        return torch.full((4,), float(i)), i


def data_stall_notice(kind="waits", start_method="fork"):
    """A slow dataset makes the loader log, once, that it waited for data (on stderr): one that
    waits (sleeps, as on the network) or one that computes; its worker started by
    `start_method` (under spawn and forkserver, a worker imports torch again as it starts)."""
    logging.basicConfig(format="%(message)s")
    ds = Slow(400) if kind == "waits" else Computes(300)
    loader = stoker.DataLoader(ds, batch_size=2, num_workers=1, stall_notice=0.3,
                               multiprocessing_context=start_method)
    for _ in loader:
        pass


def _doctor(*args):
    p = subprocess.run([sys.executable, "-m", "stoker", "doctor", "--json", *args],
                       capture_output=True, text=True)
    return p.returncode, json.loads(p.stdout)


def doctor_on_a_small_shm_with_stale_torch_files():
    """stoker doctor warns of a small /dev/shm and a stale torch file, cleans it, fails if full."""
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that no longer exists
    with open(f"/dev/shm/torch_{dead.pid}_1234_0", "wb") as f:
        f.write(b"x" * 8192)
    with open(f"/dev/shm/torch_{os.getpid()}_5678_0", "wb") as f:
        f.write(b"y" * 4096)
    code, rep = _doctor()
    checks = {c["check"]: c for c in rep["checks"]}
    assert code == 0, rep
    assert checks["/dev/shm"]["status"] == "warn" and "16.0 MiB" in checks["/dev/shm"]["detail"]
    assert checks["stale torch shared memory"]["status"] == "warn"
    assert f"torch_{dead.pid}_1234_0" in checks["stale torch shared memory"]["detail"]
    assert f"torch_{os.getpid()}_5678_0" not in checks["stale torch shared memory"]["detail"]
    code, rep = _doctor("--clean-stale-shm")
    assert rep["cleaned"] == {"files": 1, "bytes": 8192}, rep["cleaned"]
    assert sorted(os.listdir("/dev/shm")) == [f"torch_{os.getpid()}_5678_0"]
    with open("/dev/shm/filler", "wb") as f:
        f.write(b"z" * 15 * 2**20)  # 94% full
    code, rep = _doctor()
    assert code == 1 and {c["check"]: c for c in rep["checks"]}["/dev/shm"]["status"] == "fail"
