"""stoker doctor's "waiting or computing" check, from made-up readings: a worker's CPU seconds,
the seconds its threads waited for a CPU (the run queue: computing), and its busy seconds."""

from __future__ import annotations

import pytest

from stoker.tools import doctor

pytestmark = pytest.mark.unit  # no process (tests/support/tiers.py)


def _loader(pid, busy, workers=(11, 12)):
    return {"pid": pid, "workers": [{"pid": w, "seconds": {
        "loading": busy, "collating": 0.0, "encoding": 0.0, "idle": 0.0}} for w in workers]}


@pytest.fixture
def readings(monkeypatch):
    """Each worker pid's (CPU seconds, run-queue seconds), as /proc would say."""
    table: dict = {}
    monkeypatch.setattr(doctor, "_cpu_seconds", lambda pid: table[pid][0])
    monkeypatch.setattr(doctor._system, "runqueue_seconds", lambda pid: table[pid][1])
    return table


def test_workers_that_compute_on_a_quiet_machine_are_ok(readings):
    readings.update({11: (9.0, 0.2), 12: (9.5, 0.1)})
    check = doctor.waiting_or_computing([_loader(1, 10.0)])
    assert check["status"] == "ok" and check["advice"] == "", check
    assert check["detail"] == "1 running loader(s) judged: their workers compute"


def test_workers_that_wait_for_a_cpu_compute_and_are_told_the_cpus_are_taken(readings):
    # on a CPU 30% of their busy time, runnable 65%: a busy machine, not a wait on I/O
    readings.update({11: (3.0, 6.5), 12: (3.0, 6.5)})
    check = doctor.waiting_or_computing([_loader(1, 10.0)])
    assert check["status"] == "warn", check
    assert check["detail"] == ("loader pid 1: workers compute, and waited for a CPU 65% of their "
                               "busy time")
    assert "Raise threads_per_worker" not in check["advice"]
    assert check["advice"].startswith("The workers compute, but this machine's CPUs are taken: "
                                      "of the time they were busy they were on a CPU 30% and "
                                      "waited for one 65%"), check


def test_workers_that_wait_on_io_are_told_to_raise_threads(readings):
    readings.update({11: (1.0, 0.5), 12: (1.0, 0.5)})  # 15% on a CPU or waiting for one
    check = doctor.waiting_or_computing([_loader(1, 10.0)])
    assert check["status"] == "warn" and "Raise threads_per_worker" in check["advice"], check
    assert check["detail"] == "loader pid 1: workers on a CPU 10% of their busy time"


def test_a_kernel_without_schedstat_judges_by_cpu_alone(readings):
    readings.update({11: (3.0, None), 12: (3.0, None)})
    check = doctor.waiting_or_computing([_loader(1, 10.0)])
    assert "Raise threads_per_worker" in check["advice"], check


def test_gone_workers_and_short_busy_times_are_not_judged(readings):
    readings.update({11: (None, None), 12: (0.1, 5.0)})
    check = doctor.waiting_or_computing([_loader(1, 1.0)])  # 2 s busy in all: too short
    assert check["status"] == "ok" and "long enough" in check["detail"], check
