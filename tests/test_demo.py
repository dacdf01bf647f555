"""`make demo` (examples/demo.py), small: its first act trains with both loaders and gets the
same losses; its second, on a corrupt JPEG that segfaults and a worker SIGKILLed mid-epoch,
stops torch's loader with its message and lets stoker's finish, naming both deaths."""

from __future__ import annotations

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEMO = os.path.join(os.path.dirname(HERE), "examples", "demo.py")


def test_the_demo_shows_a_clean_run_and_a_bad_night(tmp_path):
    r = subprocess.run([sys.executable, DEMO, "--data", str(tmp_path / "jpegs"), "--images",
                        "320", "--epochs", "1", "--fault-epochs", "1", "--batch-size", "16"],
                       capture_output=True, text=True, timeout=300, start_new_session=True)
    out = r.stdout
    assert r.returncode == 0, out[-3000:] + r.stderr[-3000:]
    assert "Identical losses" in out, out
    assert "main-process CPU a batch" in out, out
    assert "torch, a worker killed: the run stops" in out and "Killed" in out, out
    assert "torch, the corrupt JPEG: the run stops" in out and "Segmentation fault" in out, out
    assert "stoker, both faults in one run" in out, out
    assert "SIGKILL" in out and "while loading dataset index 161" in out, out
    assert "left out: dataset index 161" in out and "quarantined" in out, out
    assert "with both faults" in out, out
