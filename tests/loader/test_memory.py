"""Shared memory held by the user is bounded by what they hold, and max_shared_memory caps it.

Small arrays are copied out of the slot, so a lent slot is always pinned by a view of at least
1/VIEW_SLOT_DIVISOR of its bytes: slot bytes held <= VIEW_SLOT_DIVISOR * bytes of tensors held.
"""

from __future__ import annotations

import pytest

from support.scenarios import run_ok


def test_keeping_only_labels_pins_no_slot():
    run_ok("memory.keeping_only_labels", timeout=180)


def test_holding_1000_tiny_batches_pins_no_slot():
    run_ok("memory.holding_1000_tiny_batches", timeout=180)


def test_large_tensors_stay_views_and_medium_ones_do_not_pin_the_slot():
    run_ok("memory.large_views_and_medium_copies", timeout=180)


def test_holding_batches_beyond_the_cap_fails_with_what_is_held():
    r = run_ok("memory.holding_beyond_the_cap", 1.0, timeout=120)
    out = r.stdout + r.stderr
    assert "MESSAGE" in r.stdout, out
    held = int(r.stdout.split("HELD ")[1].split()[0])
    assert 2 <= held <= 6, out
    message = r.stdout.split("MESSAGE ", 1)[1]
    for part in ("max_shared_memory", "still held by your code", f"your code holds {held} batch",
                 "Drop references", "prefetch_factor"):
        assert part in message, message


def test_workers_wait_for_the_user_and_resume_when_batches_are_dropped():
    run_ok("memory.workers_wait_for_the_user", 60.0, timeout=120)


@pytest.mark.unit
def test_max_shared_memory_values():
    import stoker
    from stoker.common import system as _system
    from stoker.config.options import shared_memory_cap

    ds = list(range(8))
    assert stoker.DataLoader(ds, max_shared_memory=1 << 30).options.shared_memory_cap() \
        == 1 << 30
    assert stoker.DataLoader(ds, max_shared_memory=None).options.shared_memory_cap() is None
    for bad in (0, -1, 1.5, "4GiB", True):
        with pytest.raises(ValueError, match="max_shared_memory"):
            stoker.DataLoader(ds, max_shared_memory=bad)
    real = _system.memory_limit_and_usage
    try:
        _system.memory_limit_and_usage = lambda: (8 << 30, 1 << 30)
        assert shared_memory_cap("auto") == 4 << 30
        _system.memory_limit_and_usage = lambda: (None, None)
        assert shared_memory_cap("auto") is None
    finally:
        _system.memory_limit_and_usage = real


def test_num_workers_auto_divides_the_cap_among_the_workers_running():
    """num_workers="auto" starts one of two workers; the cap is divided among the workers
    running, not the most there may be: a loop that keeps its last two 4 MiB batches under a
    24 MiB cap completes (it used to wait out its patience and fail), and the tuner adds no
    worker that would leave each one less than its batches take."""
    run_ok("memory.auto_workers_divide_the_cap_among_those_running", timeout=120)


def test_a_worker_added_takes_its_share_from_the_others():
    """A tuner that adds a worker (scripted): the running one is told its smaller share and
    lets go of free slots at once; every batch arrives and the slots never exceed the cap."""
    run_ok("memory.a_worker_added_takes_its_share", timeout=120)
