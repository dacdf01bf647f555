"""Limits that break torch's transport do not break stoker's."""

from __future__ import annotations

import pytest

from support.limits import TINY_SHM, can_unshare
from support.scenarios import run_ok


@pytest.mark.skipif(not can_unshare(), reason="needs root and unshare -m for a private /dev/shm")
def test_64mb_batches_through_a_16mb_dev_shm():
    run_ok("resources.big_batches_through_a_small_dev_shm", timeout=120, wrapper=TINY_SHM)


def test_an_iterator_is_freed_the_moment_it_is_dropped():
    """No part of an iterator holds a reference back to it: dropped mid-epoch, it is freed by its
    reference count alone (the garbage collector is off), its workers end and its descriptors
    close, with autotune and the hang watch on too."""
    run_ok("resources.a_dropped_iterator_is_freed", timeout=120)


def test_main_process_holds_few_fds_while_user_holds_many_batches():
    run_ok("resources.few_fds_while_many_batches_are_held", timeout=120)


def test_slots_are_reused_not_allocated_per_batch():
    run_ok("resources.slots_are_reused", timeout=120)
