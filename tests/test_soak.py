"""The chaos soak (tests/soak/chaos.py), short: every phase of it for about 20 s in a fresh
interpreter, a worker killed every 0.1-0.4 s (SIGKILL, SIGSEGV, SIGTERM, SIGBUS, SIGABRT; busy,
idle and starting), flaky samples under retry and skip, a poison sample, held batches. `make
soak` runs it for ten minutes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def test_a_short_chaos_soak_loses_duplicates_corrupts_and_leaks_nothing(tmp_path):
    out = tmp_path / "soak.json"
    r = subprocess.run([sys.executable, os.path.join(HERE, "soak", "chaos.py"), "--seconds",
                        "20", "--samples", "240", "--seed", "7", "--json", str(out)],
                       capture_output=True, text=True, timeout=240, start_new_session=True)
    assert out.exists(), r.stdout[-3000:] + r.stderr[-3000:]
    rep = json.loads(out.read_text())
    assert rep["ok"] and r.returncode == 0, rep.get("failure", "") + r.stderr[-3000:]
    assert set(rep["phases"]) == {"fork-persistent-retry", "fork-skip-poison",
                                  "spawn-persistent-retry", "fork-unordered-retry",
                                  "node-retry", "fork-threads-skip-poison"}
    assert all(p["epochs"] >= 2 for p in rep["phases"].values()), rep["phases"]
    assert rep["kills_survived"] >= 10 and rep["deaths"] >= 10, rep
    assert rep["kill_moments"]["busy"] > 0, rep
    assert rep["skipped"] > 0  # the flaky samples under "skip", and the poison one
