"""stoker.placements.node.budget: the node's bound on loading pool workers, handed to the group
furthest behind."""

from __future__ import annotations

import pytest

from stoker.placements.node.budget import Budget

pytestmark = pytest.mark.unit  # no process (tests/support/tiers.py)


def test_the_limit_is_at_least_one_token():
    assert Budget(4).limit == 4
    assert Budget(1).limit == 1
    assert Budget(0).limit == 1
    assert Budget(-3).limit == 1
    assert Budget("3").limit == 3
    assert Budget(2.9).limit == 2


def test_tokens_are_taken_up_to_the_limit_and_given_back():
    b = Budget(2)
    assert b.take("a", 0) is True
    assert b.take("a", 0) is True
    assert b.take("a", 0) is False  # all busy: "a" waits in line
    assert b.waiting() == []  # (no token free: nobody is called)
    b.give()
    assert b.waiting() == ["a"]
    assert b.take("a", 0) is True  # its turn: it leaves the line
    assert b.waiting() == []
    b.give()
    b.give()
    assert b.take("b", 0) and b.take("b", 0) and not b.take("b", 0)


def test_a_token_given_back_frees_exactly_one():
    b = Budget(1)
    assert b.take("a", 0)
    b.give()
    assert b.take("a", 0)
    assert not b.take("a", 0)
    b.give()
    b.give()  # (more gives than takes never make a token out of nothing)
    b.give()
    assert b.take("a", 0)
    assert not b.take("a", 0)


def test_a_group_further_behind_waiting_goes_first():
    b = Budget(1)
    assert b.take("busy", 0)
    assert not b.take("behind", 1)  # waits, 1 batch received
    assert not b.take("ahead", 9)  # waits, 9 received
    b.give()
    assert b.waiting() == ["behind", "ahead"]
    assert not b.take("ahead", 9)  # "behind" is further behind and waits: not "ahead"'s turn
    assert b.take("behind", 1)
    b.give()
    assert b.waiting() == ["ahead"]
    assert b.take("ahead", 9)


def test_a_group_as_far_behind_as_another_may_take():
    b = Budget(1)
    assert b.take("x", 0)
    assert not b.take("other", 5)
    b.give()
    assert b.take("me", 5)  # "other" is not further behind (5 is not < 5)


def test_a_group_is_not_ahead_of_itself():
    b = Budget(1)
    assert b.take("x", 0)
    assert not b.take("me", 1)  # waits with 1
    b.give()
    assert b.take("me", 3)  # its own old place in line does not block it


def test_free_tokens_beyond_those_the_groups_behind_need_can_be_taken():
    b = Budget(3)
    assert b.take("x", 0)
    assert b.take("x", 0)
    assert b.take("x", 0)
    assert not b.take("low", 1)
    b.give()
    b.give()  # two free, one group further behind waits: one is left for "high"
    assert b.take("high", 9)
    assert not b.take("high", 9)  # one free, still owed to "low"
    assert b.take("low", 1)


def test_many_waiting_behind_leave_nothing_for_a_group_ahead():
    b = Budget(2)
    assert b.take("x", 0) and b.take("x", 0)
    assert not b.take("l1", 1) and not b.take("l2", 2)
    b.give()  # one free, two groups behind
    assert not b.take("high", 9)
    b.give()  # two free, two behind: still none for "high"
    assert not b.take("high", 9)
    assert b.waiting() == ["l1", "l2", "high"]


def test_leaving_the_line():
    b = Budget(1)
    assert b.take("x", 0)
    assert not b.take("a", 1)
    assert not b.take("c", 3)
    b.leave("a")
    b.leave("never-waited")
    b.give()
    assert b.waiting() == ["c"]
    assert b.take("c", 3)


def test_the_line_is_ordered_by_how_far_behind():
    b = Budget(1)
    assert b.take("x", 0)
    for g, behind in (("a", 5), ("b", 1), ("c", 3)):
        assert not b.take(g, behind)
    assert not b.take("a", 0)  # "a" asked again: its place is where it is now
    b.give()
    assert b.waiting() == ["a", "b", "c"]
