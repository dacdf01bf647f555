"""stoker.placements.node.budget: the node's bound, shared by every group; a token given back
goes to the group whose neediest rank is furthest behind. No process."""

from __future__ import annotations

import pytest

from stoker.placements.node.budget import Budget

pytestmark = pytest.mark.unit


def test_two_groups_never_load_more_than_the_bound_together():
    b = Budget(2)
    assert b.take("g1", 0) and b.take("g2", 0)
    assert not b.take("g1", 0) and not b.take("g2", 0)
    b.give()
    assert b.take("g1", 0)
    assert not b.take("g2", 0)


def test_a_token_given_back_goes_to_the_group_furthest_behind():
    b = Budget(1)
    assert b.take("ahead", 0)
    assert not b.take("ahead", 9)  # its neediest rank received 9 batches
    assert not b.take("behind", 2)
    b.give()
    assert b.waiting() == ["behind", "ahead"]
    assert not b.take("ahead", 9)  # a group further behind waits: not its turn
    assert b.take("behind", 2)
    b.give()
    assert b.waiting() == ["ahead"]  # (the group that took its token left the line)


def test_a_group_that_leaves_the_line_is_not_woken():
    b = Budget(1)
    b.take("g", 0)
    b.take("h", 0)
    b.leave("h")
    b.give()
    assert b.waiting() == []
    b.give()  # (more given back than taken: never below zero)
    assert b.take("g", 0) and not b.take("g", 0)
