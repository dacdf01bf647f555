"""stoker bench runs end to end (a smoke test: no timing is asserted)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.timeout(700)  # (its run is bounded at 600 s)
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
            assert row["main_cpu_ms_per_batch"] > 0 and row["pss_total_mb"] > 0, row
            assert row["bound_samples_per_s"] > 0, row
            # A row the bound check rejected is a verdict on timings (a busy machine can make
            # one: the bound and the row are timed at different moments), not a failure of
            # the bench; its number stays in the report. Anything else is a failure.
            if "error" in row:
                assert row["error"].startswith("ERROR: measured"), row
                assert row["measured_samples_per_s"] > 0
            else:
                assert row["samples_per_s"] > 0 and row["share_of_bound"] > 0
    assert "vs torch" in p.stdout and "of bound" in p.stdout


@pytest.mark.unit
def test_a_row_faster_than_the_work_itself_is_reported_as_an_error():
    from stoker.tools.bench import cli

    runs = []
    for r in range(2):
        runs.append({"workload": "w", "loader": "bound", "round": r, "bound_samples_per_s": 100.0})
        for who, rate in (("torch", 50.0), ("stoker", 100.0 * cli.ABOVE_BOUND * 1.1), ("x", 90.0)):
            runs.append({"workload": "w", "loader": who, "round": r, "workers": 2,
                         "samples_per_s": rate, "main_cpu_ms_per_batch": 1.0,
                         "pss_total_mb": 1.0, "pss_single_process_mb": 1.0,
                         "syscalls_per_batch": 1.0, "time_to_first_batch_s": 0.1,
                         "batch_bytes": 2**20})
    table = {row["loader"]: row for row in cli.summarize(runs, ["w"], ["torch", "stoker", "x"])}
    assert "error" not in table["torch"] and "error" not in table["x"]
    assert table["x"]["ratio_vs_torch"] == 90.0 / 50.0 and table["x"]["share_of_bound"] == 0.9
    row = table["stoker"]
    assert row["error"].startswith("ERROR: measured 126 samples/s, 1.3x the bound"), row
    assert row["measured_samples_per_s"] == 100.0 * cli.ABOVE_BOUND * 1.1
    assert row["share_of_bound"] is None and row["ratio_vs_torch"] is None


@pytest.mark.timeout(700)  # (its run is bounded at 600 s)
def test_bench_ranks_runs_real_ranks_and_counts_their_workers(tmp_path):
    from stoker.common import system as _system

    out = tmp_path / "ranks.json"
    p = subprocess.run([sys.executable, "-m", "stoker", "bench", "--ranks", "2", "--rounds", "1",
                        "--placement", "node", "--json", str(out)], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    data = json.loads(out.read_text())
    auto = data["auto"]["local"]
    assert len(auto["per_rank"]) == 2 and all(n >= 1 for n in auto["per_rank"])
    # each rank's share of the machine, not all of it each
    assert auto["started"] <= max(2, _system.node_cpus())
    assert auto["pss_bytes"] > 0 and auto["first_batch_s"] > 0
    skewed = data["skewed"]["local"]
    assert skewed["epoch_s"] > 0 and skewed["workers_per_rank"] >= 1
    assert "skewed lock-step" in p.stdout
    # the least time the work itself takes, measured in the same run, beside the loaders'
    assert data["skewed"]["bound_s"] > 0 and "the work itself" in p.stdout
    # the node's pool: one set of workers for both ranks, within the usable CPUs
    node = data["auto"]["node"]
    assert 1 <= node["started"] <= _system.usable_cpus() and node["pss_bytes"] > 0
    assert data["skewed"]["node"]["epoch_s"] > 0 and data["skewed"]["node_over_local"] > 0


@pytest.mark.unit
def test_the_bound_collates_into_buffers_it_keeps():
    import torch

    from stoker.tools.bench.bound import collate_into

    buffers = {}
    samples = [{"x": torch.full((2, 3), float(i)), "y": i, "s": f"n{i}"} for i in range(4)]
    a = collate_into(samples, buffers)
    assert torch.equal(a["x"], torch.stack([s["x"] for s in samples]))
    assert a["y"].tolist() == [0, 1, 2, 3] and a["s"] == ["n0", "n1", "n2", "n3"]
    b = collate_into(samples, buffers)
    assert b["x"].data_ptr() == a["x"].data_ptr()  # the same buffer, batch after batch


@pytest.mark.unit
def test_autotune_scenario_names_the_batch_where_auto_reached_the_target():
    from stoker.tools.bench import autotune

    per = autotune.WINDOW * autotune.BATCH
    # one batch a second for 20 batches, then ten a second
    stamps = [float(i) for i in range(20)] + [19 + 0.1 * k for k in range(1, 41)]
    # the 16-batch window runs at 16 batches a second or faster first at batch 20 + 16 + ...
    got = autotune.batches_to_reach(stamps, 0.95 * per * 10 / autotune.WINDOW)
    assert got is not None and 20 < got <= 60
    window_end = got - 1
    rate = per / (stamps[window_end] - stamps[window_end - autotune.WINDOW])
    assert rate >= 0.95 * per * 10 / autotune.WINDOW
    assert autotune.batches_to_reach(stamps[:20], 2.0 * autotune.BATCH) is None


@pytest.mark.unit
def test_autotune_settings_run_interleaved_in_rotating_order_and_the_median_counts():
    from stoker.tools.bench import autotune

    order = []
    speed = iter([10, 20, 30, 11, 21, 31, 12, 22, 32, 13, 23, 33])

    def run(setting):
        order.append(setting)
        return {"setting": setting, "samples_per_s": next(speed)}

    got = autotune.interleaved(["a", "b", "c"], run, rounds=3)
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert [r["setting"] for r in got] == ["a", "b", "c"]
    assert [r["rounds"] for r in got] == [[10, 31, 22], [20, 11, 32], [30, 21, 12]]
    assert [r["samples_per_s"] for r in got] == [22, 20, 21]


@pytest.mark.unit
def test_a_row_above_the_bound_of_its_work_is_an_error_not_a_number():
    """A loader timed at several times what the work itself allows on this machine measured
    something else (it once put torchdata.nodes at 57x on `metadata`): the table names it."""
    import io

    from stoker.tools.bench import cli

    def run(who, rate, rnd):
        return {"workload": "metadata", "loader": who, "round": rnd, "workers": 4,
                "samples_per_s": rate, "main_cpu_ms_per_batch": 1.0, "pss_total_mb": 300.0,
                "pss_single_process_mb": 250.0, "syscalls_per_batch": 10.0,
                "time_to_first_batch_s": 1.0, "batch_bytes": 1024}

    runs = []
    for rnd in range(3):
        runs.append({"workload": "metadata", "loader": "bound", "round": rnd,
                     "bound_samples_per_s": 200.0})
        runs += [run("torch", 150.0, rnd), run("stoker", 190.0, rnd),
                 run("torchdata", 11_000.0, rnd)]
    table = cli.summarize(runs, ["metadata"], ["torch", "stoker", "torchdata"])
    rows = {r["loader"]: r for r in table}
    assert rows["stoker"]["samples_per_s"] == 190.0 and "error" not in rows["stoker"]
    assert round(rows["stoker"]["ratio_vs_torch"], 2) == 1.27
    bad = rows["torchdata"]
    assert "samples_per_s" not in bad and bad["measured_samples_per_s"] == 11_000.0
    assert bad["error"].startswith("ERROR") and "55.0x the bound" in bad["error"]
    out = io.StringIO()
    cli.print_table(table, out=out)
    line = next(ln for ln in out.getvalue().splitlines() if ln.startswith("metadata  torchdata"))
    assert "ERROR: measured 11000 samples/s" in line and "skipped" not in line

    # torch's own row above the bound: the others' ratios to it are not given either
    runs = [r if r["loader"] != "torch" else dict(r, samples_per_s=9_000.0) for r in runs]
    rows = {r["loader"]: r for r in cli.summarize(runs, ["metadata"], ["torch", "stoker"])}
    assert "error" in rows["torch"] and rows["stoker"]["ratio_vs_torch"] is None


def test_bench_remote_runs_every_kind_of_row_with_checked_values():
    """The remote workload (an HTTP object store on loopback): a torch row, a threads row and an
    async row, each a fresh interpreter whose every sample's bytes are checked."""
    from stoker.tools.bench import remote

    rows = [r for r in remote.ROWS if r[0] in ("torch, 2 workers", "stoker, 2 workers x 32 threads",
                                               "stoker, 2 workers, async x 32")]
    result = remote.main(latency_ms=5, rounds=1, samples=256, rows=rows)
    by = {r["row"]: r for r in result["summary"]}
    assert set(by) == {r[0] for r in rows}, by
    for r in by.values():
        assert "error" not in r, r
        assert r["samples_per_s"] > 0 and r["pss_total_mb"] > 0 and r["processes"] == 3
    assert result["latency_ms"] == 5


@pytest.mark.timeout(700)
def test_bench_threads_runs_every_setting_on_the_interpreter_it_runs_on(tmp_path):
    out = tmp_path / "threads.json"
    p = subprocess.run(
        [sys.executable, "-m", "stoker", "bench", "--threads", "--workloads", "compute",
         "--rounds", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert p.returncode == 0, p.stderr
    data = json.loads(out.read_text())
    from stoker.tools.bench.threads import SETTINGS

    assert sorted(r["label"] for r in data["runs"]) == sorted(s[0] for s in SETTINGS)
    for r in data["runs"]:
        assert "error" not in r, r
        assert r["samples_per_s"] > 0 and r["pss_total_mb"] > 0, r
        assert r["gil_enabled"] == getattr(sys, "_is_gil_enabled", lambda: True)()
    rows = data["summary"]["workloads"]["compute"]["rows"]
    assert rows["stoker 1w x2"]["at_once"] == 2, rows  # two samples at once, mid-run
    assert "no worker, 2 threads / torch 2 workers" in p.stdout


@pytest.mark.unit
def test_bench_threads_ratios_are_taken_within_a_round():
    from stoker.tools.bench.threads import summarize

    def row(label, r, rate, pss=100.0):
        return {"workload": "compute", "label": label, "round": r, "samples_per_s": rate,
                "pss_total_mb": pss, "at_once": None, "gil_enabled": False}

    runs = []
    for r, scale in ((0, 1.0), (1, 3.0), (2, 2.0)):  # the machine's speed drifts between rounds
        runs += [row("stoker 1w x1", r, 100 * scale), row("stoker 1w x2", r, 190 * scale),
                 row("stoker 1w auto", r, 180 * scale), row("stoker 0w x2", r, 200 * scale, 50),
                 row("torch 1w", r, 100 * scale), row("torch 2w", r, 200 * scale, 200)]
    s = summarize(runs, ["compute"])["workloads"]["compute"]
    assert s["two_threads_vs_one"] == pytest.approx(1.9)
    assert s["no_worker_two_threads_vs_torch_2w"] == pytest.approx(1.0)
    assert s["no_worker_pss_vs_torch_2w"] == pytest.approx(0.25)
    assert s["best_fixed"] == "stoker 1w x2"
    assert s["auto_vs_best_fixed"] == pytest.approx(180 / 190)
