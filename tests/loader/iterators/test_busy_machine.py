"""A worker that computes on a machine whose CPUs are all taken (issue 50): it is runnable but
not running much of the time, and the kernel says so (its threads' run-queue time). It must be
judged computing, not waiting: "auto" keeps it at one thread (Python 3.11: the GIL), the stall
notice and stoker doctor say the CPUs are taken and never "raise threads_per_worker".

The scenario takes the CPUs itself (support/burner.py: 6 spinning processes per CPU at its own
priority, in its own session, where its loader runs: a kernel that shares the CPUs between
sessions first would otherwise give the loader its session's share), so what it checks holds
however busy the machine already is: other processes only add to the run queue. No timing is
asserted."""

from __future__ import annotations

import json

from stoker.common.system import rank_cpus
from support.scenarios import run_ok


def _result(r) -> dict:
    line = next(x for x in r.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_a_worker_that_computes_on_a_busy_machine_is_judged_computing():
    r = run_ok("busy_machine.cpu_bound_worker", timeout=240, kwargs={"per_cpu": 6})
    res = _result(r)
    in_flight = res["in_flight"]
    # "auto" starts at 8 at once; judged computing, it went to one thread (its status page says
    # how many of its samples load at once; the batches started ahead at 8 are done long before
    # the middle of the epoch)
    assert max(in_flight[len(in_flight) // 2:]) == 1, in_flight
    # the stall notice (the loop waited: one worker, its CPU shared with the burners)
    assert r.stderr.count("waited for data") == 1, r.stderr
    assert "threads_per_worker=\"auto\" stops" not in r.stderr, r.stderr
    assert "Raise threads_per_worker" not in r.stderr, r.stderr
    assert "The workers compute, but this machine's CPUs are taken" in r.stderr, r.stderr
    # its one worker may keep every CPU of this process busy (used where threads compute at
    # once: a free-threaded Python)
    assert res["cpus"] == rank_cpus(), res
    check = res["doctor"]
    assert check["status"] == "warn" and "workers compute" in check["detail"], check
    assert check["advice"].startswith("The workers compute, but this machine's CPUs"), check
