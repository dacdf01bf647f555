"""Settings real training jobs create: other threads, stopped or stuck workers, dropped
iterators, redirected output, the user's gc.freeze(), indices that are not ints.

The scenarios run in a fresh interpreter each: tests/scenarios/where_jobs_run.py."""

from __future__ import annotations

from support.scenarios import run_ok


def test_stats_from_another_thread_while_iterating():
    # A Prometheus exporter or a monitoring thread calls stats() at any moment, including while
    # the iterator starts its workers and while the loop waits inside the engine.
    run_ok("where_jobs_run.stats_from_another_thread", timeout=120)


def test_worker_output_is_flushed_and_exits_are_quiet(tmp_path):
    # Worker prints reach a redirected stdout (block-buffered), and neither the end of an epoch
    # nor an iterator dropped mid-epoch prints anything on stderr.
    out = tmp_path / "out.txt"
    r = run_ok("where_jobs_run.worker_output_reaches_redirected_stdout", str(out), timeout=60)
    assert r.stderr.strip().endswith("DONE"), r.stderr
    assert "Traceback" not in r.stderr and "Error" not in r.stderr, r.stderr
    lines = out.read_text().splitlines()
    assert sorted(x for x in lines if x.startswith("sample")) == sorted(
        f"sample {i}" for i in range(8)), lines


def test_users_gc_freeze_is_kept():
    run_ok("where_jobs_run.users_gc_freeze_is_kept", timeout=90)


def test_sigstopped_idle_worker_is_named_and_restarted_with_hang_timeout():
    # A worker stopped (SIGSTOP: a debugger, a cgroup freezer) while idle never takes the tasks
    # queued to it. With hang_timeout it is killed, restarted and its work re-issued.
    r = run_ok("where_jobs_run.sigstopped_idle_worker_restarted", timeout=90)
    assert "stopped (state T" in r.stderr, r.stderr


def test_sigstopped_worker_without_hang_timeout_is_named_in_log_and_stats():
    r = run_ok("where_jobs_run.sigstopped_worker_named_without_hang_timeout", timeout=90)
    assert r.stderr.count("without starting them") == 1, r.stderr


def test_forking_with_other_threads_warns_once_naming_them():
    run_ok("where_jobs_run.forking_with_other_threads_warns_once", timeout=90)


def test_quarantine_names_indices_that_are_not_python_ints():
    run_ok("where_jobs_run.quarantine_names_numpy_indices", timeout=90)


def test_quarantine_counts_do_not_add_up_across_epochs():
    # One death at index 5 in each of two epochs (say, unrelated kills): nothing is poisoned.
    run_ok("where_jobs_run.quarantine_counts_per_epoch", timeout=90)


def test_typing_alias_workers_list_and_forkserver_pickle_warning():
    run_ok("where_jobs_run.typing_alias_workers_and_pickle_warning", timeout=90)


def test_quarantine_names_str_indices():
    run_ok("where_jobs_run.quarantine_names_str_indices", timeout=90)


def test_slow_start_up_is_not_killed_as_a_hang():
    # hang_timeout bounds one sample: a worker_init_fn that takes longer than it is not a hang.
    run_ok("where_jobs_run.slow_start_up_is_not_a_hang", timeout=90)


def test_a_pause_in_the_training_loop_is_not_a_hang():
    # An evaluation or a checkpoint save longer than hang_timeout, mid-epoch and between epochs:
    # idle workers whose results wait in their channels are healthy, not stuck.
    r = run_ok("where_jobs_run.pause_in_the_loop_is_not_a_hang", timeout=90)
    assert "without starting them" not in r.stderr, r.stderr
