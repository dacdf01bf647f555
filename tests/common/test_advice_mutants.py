"""stoker.common.advice: telling workers that wait from workers that compute, and what to tell them."""

from __future__ import annotations

import pytest

from stoker.common import advice as _advice

pytestmark = pytest.mark.unit  # no process (tests/support/tiers.py)


def test_waiting_is_less_than_half_the_busy_time_on_a_cpu():
    assert _advice.WAITING_SHARE == 0.5
    assert _advice.waiting(0.1, 1.0) is True
    assert _advice.waiting(0.49, 1.0) is True
    assert _advice.waiting(0.5, 1.0) is False  # exactly half: not waiting
    assert _advice.waiting(0.9, 1.0) is False
    assert _advice.waiting(2.0, 1.0) is False


def test_waiting_needs_a_cpu_time_and_some_busy_time():
    assert _advice.waiting(None, 1.0) is False
    assert _advice.waiting(0.0, 0.0) is False
    assert _advice.waiting(-1.0, 0.0) is False  # busy 0: never judged
    assert _advice.waiting(-1.0, -2.0) is False
    assert _advice.waiting(0.0, 1.0) is True


def test_the_advice_names_the_share_on_a_cpu_and_what_to_raise():
    text = _advice.raise_threads(0.25, 1.0)
    assert text.startswith("The workers were on a CPU only 25% of the time they were busy: "
                           "they wait (on storage, the network, a lock) rather than compute, "
                           "so more processes would only wait too. Raise threads_per_worker "
                           "(16, 64, or \"auto\"): each worker then loads that many samples at "
                           "once, with no more processes or memory; an async def __getitem__ "
                           "runs that many on one event loop.")
    assert text == _advice.raise_threads(0.25, 1.0, threads=1)
    assert text == _advice.raise_threads(0.25, 1.0, threads=None)


def test_the_share_is_rounded_and_capped_at_all_of_the_time():
    assert "only 33% of" in _advice.raise_threads(1.0, 3.0)
    assert "only 67% of" in _advice.raise_threads(2.0, 3.0)
    assert "only 100% of" in _advice.raise_threads(5.0, 1.0)


def test_the_advice_names_the_threads_set_now():
    text = _advice.raise_threads(0.1, 1.0, threads=8)
    assert "Raise threads_per_worker (now 8) (16, 64, or \"auto\")" in text
    assert "(now 'x')" in _advice.raise_threads(0.1, 1.0, threads="x")
    assert "(now 2)" in _advice.raise_threads(0.1, 1.0, threads=2)


def test_auto_is_told_to_set_a_number_above_the_batch():
    text = _advice.raise_threads(0.1, 1.0, threads="auto")
    assert ("threads_per_worker=\"auto\" stops at the batch's size; set a number above it "
            "(64, 128): the threads a batch leaves free load the next batch's samples, with no "
            "more processes or memory") in text
    assert "Raise" not in text and "now" not in text.split("stops")[0]


def test_the_share_scales_with_the_busy_time():
    assert _advice.waiting(1.5, 4.0) is True  # 37.5%
    assert _advice.waiting(2.5, 4.0) is False  # 62.5%


# -- the run queue: waiting for a CPU is computing -------------------------------------------------
def test_time_waiting_for_a_cpu_counts_as_computing():
    assert _advice.waiting(0.3, 1.0) is True  # on a CPU 30%: waits
    assert _advice.waiting(0.3, 1.0, 0.3) is False  # and runnable 30% more: computes
    assert _advice.waiting(0.3, 1.0, 0.19) is True  # 49%
    assert _advice.waiting(0.3, 1.0, 0.2) is False  # exactly half
    assert _advice.waiting(0.3, 1.0, None) is True  # not known: CPU alone
    assert _advice.waiting(0.3, 1.0, -5.0) is True  # (nonsense counts as none)
    assert _advice.waiting(None, 1.0, 0.9) is False  # no CPU reading: never judged


def test_crowded_is_a_quarter_of_the_busy_time_on_the_run_queue():
    assert _advice.CROWDED_SHARE == 0.25
    assert _advice.crowded(0.25, 1.0) is True
    assert _advice.crowded(0.249, 1.0) is False
    assert _advice.crowded(None, 1.0) is False
    assert _advice.crowded(1.0, 0.0) is False and _advice.crowded(1.0, -1.0) is False


def test_workers_on_a_crowded_machine_are_told_the_cpus_are_taken_not_to_raise_threads():
    text = _advice.cpus_taken(0.4, 0.6, 1.0)
    assert text.startswith("The workers compute, but this machine's CPUs are taken: of the time "
                           "they were busy they were on a CPU 40% and waited for one 60% "
                           "(runnable, on the kernel's run queue). More workers or threads "
                           "would only wait longer. Run fewer"), text
    assert "other ranks' workers or other jobs on this node" in text
    assert "Raise" not in text
    assert "CPU 100% and waited for one 0%" in _advice.cpus_taken(3.0, -1.0, 2.0)


def test_the_stall_notice_picks_its_advice():
    from stoker.loader.iterators.stats import advice

    hint = "more num_workers"
    assert advice("loading", 0.2, 1.0, 1, hint).startswith("The workers were on a CPU only 20%")
    assert advice("loading", 0.2, 1.0, 1, hint, 0.7).startswith(
        "The workers compute, but this machine's CPUs are taken")  # runnable 70%: computing
    assert advice("collating", 0.2, 1.0, 1, hint, 0.7).startswith("The workers compute, but")
    assert advice("loading", 0.9, 1.0, 1, hint, 0.05) == hint  # a quiet machine
    assert advice("loading", 0.9, 1.0, 1, hint, None) == hint
    assert advice("encoding", 0.2, 1.0, 1, hint) == hint  # (only loading is told threads)
    assert advice("loading", None, 1.0, 1, hint, 0.7) == hint  # no CPU known: no judgment
