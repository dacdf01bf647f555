"""Threads and forks that are not workers: a child forked from the main process frees nothing the
main process uses and keeps none of the loader's slots or descriptors; workers started from a
thread outlive that thread.

The scenarios run in a fresh interpreter each: tests/scenarios/threads_and_forks.py."""

from __future__ import annotations

import pytest

from support.scenarios import run_ok


# The child forked from a process with a live iterator and a held batch reports what it still
# maps and holds; the parent then finishes the epoch holding every batch and checks them all.
@pytest.mark.parametrize("garbage", [False, True], ids=["held", "cyclic-garbage"])
def test_forked_child_frees_no_slot_and_keeps_no_engine_resource(garbage):
    r = run_ok("threads_and_forks.forked_child_frees_nothing", garbage, timeout=120)
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines() if " slots=" in line)
    # Right after the fork the child maps only the held batch's slot, holds no engine fd...
    assert lines["before"] == "slots=1 engine_fds=[]", r.stdout
    # ... and nothing once its copy of the batch is gone.
    assert lines["after"] == "slots=0 engine_fds=[]", r.stdout


def test_workers_started_from_a_thread_outlive_it():
    run_ok("threads_and_forks.workers_outlive_their_thread", timeout=120)


def test_no_sequence_of_forks_gc_and_restarts_loses_or_repeats_a_sample():
    # Batches held in cyclic garbage, an exception kept in a local, a helper process forked every
    # 10 batches that collects garbage, workers killed and restarted (by fork, so each new worker
    # inherits every live lease), and a garbage collector that runs all the time.
    run_ok("threads_and_forks.forks_gc_and_restarts_keep_every_sample", timeout=180)


def test_stats_read_from_threads_while_iterating_with_a_death(tmp_path):
    run_ok("threads_and_forks.stats_read_from_threads_while_iterating", str(tmp_path),
           timeout=180)
