"""threads_per_worker (tests/scenarios/threads_in_workers.py): each scenario in its own process,
with a hard time bound."""

from __future__ import annotations

import pytest

from support.scenarios import run_ok


@pytest.mark.parametrize("async_dataset", [False, True])
def test_every_sample_once_in_order(async_dataset):
    run_ok("threads_in_workers.every_sample_once_in_order", async_dataset, timeout=120)


def test_the_next_batch_loads_while_the_last_samples_do():
    run_ok("threads_in_workers.next_batch_loads_while_the_last_samples_do", timeout=120)


def test_bit_identical_under_per_sample_seed():
    run_ok("threads_in_workers.bit_identical_under_per_sample_seed", timeout=120)


def test_same_draws_from_sample_generator_at_any_thread_count():
    run_ok("threads_in_workers.same_draws_from_sample_generator", timeout=120)


@pytest.mark.parametrize("policy", ["raise", "skip", "retry"])
def test_a_raising_sample_is_named(policy):
    run_ok("threads_in_workers.raising_sample_named", policy, timeout=120)


@pytest.mark.parametrize("name", ["segfault_quarantined", "segfault_raises",
                                  "sigkill_with_many_in_flight", "external_kill_mid_batch",
                                  "hung_thread_named", "resume_mid_epoch_across_threads",
                                  "stats_and_top_show_samples_in_flight",
                                  "async_client_lives_with_the_worker",
                                  "async_segfault_at_one_thread_quarantined",
                                  "async_getitems_under_each_policy"])
def test_faults_under_threads(name):
    run_ok(f"threads_in_workers.{name}", timeout=180)


def _have(*modules) -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) for m in modules)


@pytest.mark.skipif(not _have("moto", "boto3", "flask"),
                    reason="moto[server] and boto3 (tests/requirements-frameworks.txt)")
def test_a_real_s3_api_read_from_worker_threads():
    run_ok("s3.read_from_worker_threads", timeout=300)


def _judge(w, samples, wall_s, cpu_s):
    """Batches like this one until `w` decides (its width's first batch is never judged)."""
    before = (w.now, w.settled)
    for _ in range(64):
        w.observe(samples, wall_s, cpu_s)
        if (w.now, w.settled) != before:
            return
    raise AssertionError(f"no decision at width {w.now}")


@pytest.mark.unit
def test_auto_widens_while_waiting_and_ignores_a_short_batch():
    from stoker.worker.inflight import Width

    w = Width("auto")
    start = w.now
    w.observe(32, 0.2, 0.01)  # the first batch at a width is not judged
    assert w.now == start
    _judge(w, 32, 0.2, 0.01)  # waiting: on a CPU 5% of the time
    assert w.now > start and not w.settled
    wide = w.now
    w.observe(32, 0.02, 0.001)  # (fresh)
    for _ in range(5):
        w.observe(5, 1.0, 0.001)  # a short last batch: slow, but not the width's fault
    assert w.now >= wide and not w.settled


@pytest.mark.unit
def test_auto_keeps_a_jump_that_gained_and_undoes_one_that_did_not():
    from stoker.worker.inflight import Width

    for rate_after, kept in ((1.5, True), (1.05, False), (0.5, False)):
        w = Width("auto")
        start = w.now
        _judge(w, 32, 0.2, 0.01)  # 160 samples/s, waiting
        wide = w.now
        assert wide > start
        _judge(w, 32, 0.2 / rate_after, 0.01)
        assert w.settled and w.now == (wide if kept else start), (rate_after, w.now)


@pytest.mark.unit
def test_auto_stays_at_one_thread_when_the_worker_computes():
    from stoker.worker.inflight import Width

    w = Width("auto")
    _judge(w, 32, 0.5, 0.49)
    assert (w.now, w.settled) == (1, True)
