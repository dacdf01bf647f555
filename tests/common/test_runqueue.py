"""Reading the seconds a process's threads waited for a CPU (``/proc/PID/task/TID/schedstat``'s
second field) from a fake /proc, threads that end mid-read, kernels that do not say; and the
GIL's state."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from conftest import write_file
from stoker.common import system as _system

pytestmark = pytest.mark.unit  # no process (tests/support/tiers.py)


def _thread(tree, pid, tid, text):
    write_file(str(tree / "proc" / str(pid) / "task" / str(tid) / "schedstat"), text)


def test_a_schedstat_line_is_cpu_then_run_queue_then_slices():
    assert _system.runqueue_ns("562926751 11241089 134\n") == 11241089
    assert _system.runqueue_ns(b"1 2 3") == 2
    assert _system.runqueue_ns("0 0 0") == 0
    for nothing in ("", None, b"", "12", "1 x 3", "1 -2 3"):
        assert _system.runqueue_ns(nothing) is None


def test_a_schedstat_line_gives_cpu_and_run_queue_together():
    assert _system.schedstat_ns("562926751 11241089 134\n") == (562926751, 11241089)
    assert _system.schedstat_ns(b"0 0 0") == (0, 0)
    for nothing in ("", None, b"", "12", "1 x 3", "x 1 3", "-1 2 3"):
        assert _system.schedstat_ns(nothing) is None


def test_cpu_and_run_queue_are_summed_over_the_threads_to_the_nanosecond(cgroup_tree):
    _thread(cgroup_tree, 42, 42, "900000001 1000000000 5\n")
    _thread(cgroup_tree, 42, 43, "100000000 500000000 2\n")
    assert _system.thread_schedstat_ns(42) == {42: (900_000_001, 1_000_000_000),
                                               43: (100_000_000, 500_000_000)}
    cpu, queued = _system.schedstat_seconds(42)
    assert cpu == pytest.approx(1.000000001, abs=1e-12) and queued == pytest.approx(1.5)
    assert _system.schedstat_seconds(99) is None  # (gone)


def test_every_thread_is_read_and_summed(cgroup_tree):
    _thread(cgroup_tree, 42, 42, "900 1000000000 5\n")
    _thread(cgroup_tree, 42, 43, "100 500000000 2\n")
    _thread(cgroup_tree, 42, 44, "100 0 1\n")
    assert _system.thread_runqueue_ns(42) == {42: 1_000_000_000, 43: 500_000_000, 44: 0}
    assert _system.runqueue_seconds(42) == pytest.approx(1.5)


def test_self_is_this_process(cgroup_tree):
    _thread(cgroup_tree, "self", 7, "1 250000000 1\n")
    assert _system.runqueue_seconds() == pytest.approx(0.25)
    assert _system.thread_runqueue_ns() == {7: 250_000_000}


def test_a_process_that_is_gone_or_a_kernel_without_schedstat_says_none(cgroup_tree):
    assert _system.thread_runqueue_ns(99) is None and _system.runqueue_seconds(99) is None
    # the threads are listed, but the kernel has no schedstat (CONFIG_SCHED_INFO unset)
    os.makedirs(cgroup_tree / "proc" / "98" / "task" / "98")
    assert _system.runqueue_seconds(98) is None
    _thread(cgroup_tree, 97, 97, "")  # (a read that says nothing)
    assert _system.runqueue_seconds(97) is None


def test_a_thread_that_ends_while_it_is_read_is_left_out(cgroup_tree, monkeypatch):
    _thread(cgroup_tree, 42, 42, "1 2000000000 1\n")
    _thread(cgroup_tree, 42, 43, "1 3000000000 1\n")
    _thread(cgroup_tree, 42, 44, "1 4000000000 1\n")
    real_open, real_read = os.open, os.read
    gone = str(cgroup_tree / "proc" / "42" / "task" / "43" / "schedstat")
    ended = str(cgroup_tree / "proc" / "42" / "task" / "44" / "schedstat")
    fds = {}

    def opening(path, *a):
        if path == gone:  # listed, then gone before its open
            raise FileNotFoundError(path)
        fd = real_open(path, *a)
        fds[fd] = path
        return fd

    def reading(fd, n):
        if fds.get(fd) == ended:  # opened, then gone before its read (the kernel: ESRCH)
            raise ProcessLookupError(fd)
        return real_read(fd, n)

    monkeypatch.setattr(_system.os, "open", opening)
    monkeypatch.setattr(_system.os, "read", reading)
    assert _system.thread_runqueue_ns(42) == {42: 2_000_000_000}
    assert _system.runqueue_seconds(42) == pytest.approx(2.0)


def test_this_kernel_says_for_this_process():
    """Not a fake: this machine's kernel (CI's and ours have schedstat) lists this thread."""
    per_thread = _system.thread_runqueue_ns()
    if per_thread is None:
        pytest.skip("this kernel has no /proc/PID/task/TID/schedstat")
    assert threading.get_native_id() in per_thread
    assert all(ns >= 0 for ns in per_thread.values())
    assert _system.runqueue_seconds(os.getpid()) >= 0


def test_the_gil_is_the_interpreters(monkeypatch):
    monkeypatch.delattr(sys, "_is_gil_enabled", raising=False)
    assert _system.gil_enabled() is True  # (before 3.13: always)
    monkeypatch.setattr(sys, "_is_gil_enabled", lambda: False, raising=False)
    assert _system.gil_enabled() is False
    monkeypatch.setattr(sys, "_is_gil_enabled", lambda: True, raising=False)
    assert _system.gil_enabled() is True
