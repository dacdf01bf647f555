"""loader.stats(), the data-stall notice, stoker top, Prometheus and stoker doctor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from support.limits import TINY_SHM, can_unshare
from support.scenarios import run_ok, start_running_loader


def test_stats_is_json_and_describes_workers_and_memory():
    import stoker
    from scenario_datasets import Squares

    # 256 KiB per sample: large enough to be delivered as views of the slots (held by the user)
    loader = stoker.DataLoader(Squares(64, shape=(64 * 1024,)), batch_size=4, num_workers=2,
                               persistent_workers=True)
    held = []
    for i, b in enumerate(loader):
        held.append(b)
        if i == 9:
            s = json.loads(json.dumps(loader.stats()))
    assert s["batches_yielded"] == 10 and s["num_workers"] == 2 and s["epoch"] == 1
    assert 0.0 <= s["data_stall"] <= 1.0 and s["seconds_waiting_for_data"] >= 0
    assert [w["id"] for w in s["workers"]] == [0, 1]
    for w in s["workers"]:
        assert w["pid"] and w["samples"] > 0 and w["batches"] > 0 and w["rss_bytes"] > 0
        assert set(w["seconds"]) == {"getitem", "collate", "encode", "idle"}
        assert w["restarts"] == 0 and w["state"] in ("idle", "loading", "encoding")
    mem = s["memory"]
    assert mem["slots_held_by_user"] >= 1 and mem["bytes_mapped"] >= mem["bytes_held_by_user"] > 0
    assert s["deaths"] == [] and s["skipped"] == []


@pytest.mark.parametrize("kind,start_method", [("waits", "fork"), ("computes", "fork"),
                                               ("waits", "spawn"), ("computes", "spawn")])
def test_data_stall_notice_names_the_slow_stage(kind, start_method):
    """Workers that wait (their CPU idle in __getitem__) are told to raise threads_per_worker;
    workers that compute, to add workers (or, where other processes keep this machine's CPUs
    busy, that they are taken: test_busy_machine.py makes sure of that case). Under spawn (and
    3.14's forkserver) a worker spends seconds of CPU importing torch before it is ready: not
    work, so a worker that waits is still told so (it was told "More num_workers")."""
    r = run_ok("observability.data_stall_notice", kind, start_method, timeout=120)
    assert r.stderr.count("waited for data") == 1, r.stderr
    assert "__getitem__" in r.stderr, r.stderr
    if kind == "waits":
        assert "Raise threads_per_worker" in r.stderr and "More num_workers" not in r.stderr
    else:
        assert "Raise threads_per_worker" not in r.stderr, r.stderr
        assert ("More num_workers" in r.stderr) != ("this machine's CPUs are taken" in r.stderr)


def test_top_finds_a_running_loader_and_its_workers():
    proc, pids = start_running_loader()
    try:
        time.sleep(1.0)
        out = subprocess.run([sys.executable, "-m", "stoker", "top", "--once", "--json"],
                             capture_output=True, text=True, timeout=60)
        loaders = [ld for ld in json.loads(out.stdout) if ld["pid"] == proc.pid]
        assert len(loaders) == 1, out.stdout
        ld = loaders[0]
        assert [w["pid"] for w in ld["workers"]] == pids
        assert ld["batches_yielded"] > 0 and ld["num_workers"] == 2
        # what is true of a loader nothing tunes: both workers take tasks, each 2 deep
        assert (ld["active_workers"], ld["prefetch_factor"]) == (2, 2), ld
        assert ld["tuned"] == {"workers": False, "prefetch_factor": False}, ld
        assert all(w["samples"] > 0 for w in ld["workers"])
        text = subprocess.run([sys.executable, "-m", "stoker", "top", str(proc.pid), "--once"],
                              capture_output=True, text=True, timeout=60).stdout
        assert f"PID {proc.pid}" in text and str(pids[0]) in text and "samples/s" in text
        assert "workers 2/2  prefetch 2  " in text and "(auto)" not in text, text
    finally:
        proc.kill()
        proc.wait()


def test_doctor_counts_the_workers_of_every_loader_on_this_machine():
    from stoker.tools import doctor

    proc, pids = start_running_loader()  # 2 workers
    try:
        time.sleep(1.0)
        seen = [e for e in doctor.loaders_on_this_machine() if e["pid"] == proc.pid]
        assert seen == [{"pid": proc.pid, "workers": 2, "pool": False}]
        out = subprocess.run([sys.executable, "-m", "stoker", "doctor", "--json"],
                             capture_output=True, text=True, timeout=60)
        checks = {c["check"]: c for c in json.loads(out.stdout)["checks"]}
        assert "run " in checks["workers on this machine"]["detail"]
    finally:
        proc.kill()
        proc.wait()
    # eight ranks of 4 workers each on 16 CPUs: 40 processes want a core
    ranks = [{"pid": 100 + r, "workers": 4} for r in range(8)]
    c = doctor.workers_against_cpus(ranks, 16)
    assert c["status"] == "warn" and "8 process(es)" in c["detail"] and "40 for 16" in c["detail"]
    assert "LOCAL_WORLD_SIZE" in c["advice"]
    assert doctor.workers_against_cpus(ranks[:2], 16)["status"] == "ok"
    assert doctor.workers_against_cpus([], 16)["status"] == "ok"
    # the node's pool: 8 ranks served by one pool of 8 workers need 16 cores, not 24
    pooled = [{"pid": 100 + r, "workers": 0} for r in range(8)] + [
        {"pid": 99, "workers": 8, "pool": True}]
    c = doctor.workers_against_cpus(pooled, 16)
    assert c["status"] == "ok" and "node's pool" in c["detail"], c


def test_prometheus_scrape_on_localhost():
    pytest.importorskip("prometheus_client")
    import stoker
    import stoker.tools.monitoring
    from scenario_datasets import Squares

    loader = stoker.DataLoader(Squares(64), batch_size=4, num_workers=2, persistent_workers=True)
    it = iter(loader)  # (its workers start before the server's thread)
    with stoker.tools.monitoring.serve_prometheus(loader, 0, addr="127.0.0.1",
                                                  name="train") as served:
        for i, _ in enumerate(it):
            if i == 5:
                body = urllib.request.urlopen(f"http://127.0.0.1:{served.port}/metrics",
                                              timeout=10).read()
    assert not any(t.name.startswith("Thread") and "serve_forever" in t.name
                   for t in threading.enumerate())  # close() joined it
    it._shutdown_workers()
    text = body.decode()
    assert 'stoker_batches_yielded_total{loader="train"} 6.0' in text, text
    assert 'stoker_worker_samples_total{loader="train",worker="1"}' in text
    assert 'stoker_worker_seconds_total{loader="train",stage="getitem",worker="0"}' in text
    assert "stoker_data_stall_ratio" in text and 'kind="mapped"' in text


def test_doctor_tells_workers_that_wait_from_workers_that_compute():
    """A running loader whose workers sleep in __getitem__ (as on the network) is told to raise
    threads_per_worker; workers whose CPU time matches their busy time are not."""
    from stoker.tools import doctor, top

    proc, pids = start_running_loader()  # 2 workers, 20 ms of sleep per sample
    try:
        deadline = time.monotonic() + 60
        while True:  # until its workers were busy long enough to be judged
            mine = [ld for ld in top.snapshot() if ld["pid"] == proc.pid]
            check = doctor.waiting_or_computing(mine)
            if check["status"] == "warn" or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert check["status"] == "warn", check
        assert f"loader pid {proc.pid}" in check["detail"], check
        assert "Raise threads_per_worker" in check["advice"], check
    finally:
        proc.kill()
        proc.wait()
    me = os.getpid()
    cpu = doctor._cpu_seconds(me)
    busy = max(doctor.MIN_BUSY_S, cpu)  # all of it on a CPU: it computes
    fake = [{"pid": me, "workers": [{"pid": me, "seconds": {
        "loading": busy, "collating": 0.0, "encoding": 0.0, "idle": 0.0}}]}]
    # (ok, or, where other processes keep this machine's CPUs busy, told that they are taken)
    assert "Raise threads_per_worker" not in doctor.waiting_or_computing(fake)["advice"]


@pytest.mark.skipif(not can_unshare(), reason="needs root and unshare -m for a private /dev/shm")
def test_doctor_on_a_small_shm_with_stale_torch_files():
    run_ok("observability.doctor_on_a_small_shm_with_stale_torch_files", timeout=120,
           wrapper=TINY_SHM)
