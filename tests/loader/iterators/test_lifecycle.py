"""Clean exits: Ctrl+C, a killed parent, low limits, and many create/destroy cycles leave
nothing behind.

The scenarios run in a fresh interpreter each: tests/scenarios/lifecycle.py."""

from __future__ import annotations

import os
import signal
import time

import pytest

from scenarios.probes import alive
from support.scenarios import run_ok, start_running_loader


def test_ctrl_c_gives_one_keyboard_interrupt_and_silent_workers():
    proc, pids = start_running_loader()
    try:
        time.sleep(0.3)
        os.killpg(proc.pid, signal.SIGINT)  # the whole process group, as a terminal does
        _, err = proc.communicate(timeout=30)  # (a hang's bound, not a speed)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert err.count("KeyboardInterrupt") == 1, err
    assert err.count("Traceback") == 1, err
    time.sleep(0.2)
    assert not [p for p in pids if alive(p)], pids


def test_parent_killed_takes_workers_with_it():
    for method in ("fork", "spawn"):
        proc, pids = start_running_loader(method)
        try:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            # the kernel signals them as the parent dies (PR_SET_PDEATHSIG): a bound for a
            # busy machine, not a speed
            deadline = time.monotonic() + 10.0
            while time.monotonic() < deadline and [p for p in pids if alive(p)]:
                time.sleep(0.02)
            assert not [p for p in pids if alive(p)], (method, pids)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)


def test_low_fd_limit_with_many_held_batches():
    run_ok("lifecycle.low_fd_limit_with_held_batches", timeout=120)


@pytest.mark.timeout(700)  # (the scenario's own bound is 600 s)
def test_create_iterate_destroy_cycles_leak_nothing():
    run_ok("lifecycle.create_iterate_destroy_cycles", timeout=600)


def test_spawn_with_an_unpicklable_dataset_names_the_attribute():
    run_ok("lifecycle.spawn_with_unpicklable_dataset", timeout=60)


def test_fork_with_cuda_initialised_switches_to_forkserver():
    run_ok("lifecycle.fork_with_cuda_initialised", timeout=60)


def test_workers_ignore_sigint_and_close_inherited_descriptors():
    run_ok("lifecycle.workers_ignore_sigint_and_close_inherited_fds", timeout=60)


def test_worker_that_cannot_start_is_reported_once_not_restarted():
    r = run_ok("lifecycle.worker_that_cannot_start", timeout=120)
    assert "restarted it" not in r.stderr, r.stderr
