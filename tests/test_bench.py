"""stoker bench runs end to end (a smoke test: no timing is asserted)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_bench_runs_and_reports_both_loaders(tmp_path):
    out = tmp_path / "bench.json"
    p = subprocess.run(
        [sys.executable, "-m", "stoker", "bench", "--workloads", "fields,tokens", "--rounds", "1",
         "--no-peers", "--json", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert p.returncode == 0, p.stderr
    data = json.loads(out.read_text())
    rows = {(r["workload"], r["loader"]): r for r in data["summary"]}
    for wl in ("fields", "tokens"):
        for who in ("torch", "stoker"):
            row = rows[(wl, who)]
            assert "error" not in row, row
            assert row["samples_per_s"] > 0 and row["main_cpu_ms_per_batch"] > 0
            assert row["pss_total_mb"] > 0
    assert "vs torch" in p.stdout and "stoker" in p.stdout
