"""stoker.placements.node.streams: which ranks of a group build the same task stream, and so
who is still owed a batch one of them took."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from stoker.placements.node import streams
from stoker.placements.node.streams import LATER, Streams

pytestmark = pytest.mark.unit  # no process (tests/support/tiers.py)


def _ident(seed, epoch, first=b"0"):
    return (seed, epoch, 0, first)


def test_constants():
    assert streams.EXPECT_S == 60.0 and LATER == -1


def test_a_rank_new_to_the_group_is_taken_for_everyones_peer():
    s = Streams()
    s.attach(1)
    s.attach(2)
    assert s.owed(_ident(7, 1), {1}) == {2}
    assert s.owed(_ident(7, 1), {1, 2}) == set()
    assert s.owed(_ident(7, 1), set()) == {1, 2}


def test_the_first_task_of_an_epoch_says_who_is_a_peer():
    s = Streams()
    for r in (1, 2, 3):
        s.attach(r)
    assert s.saw(1, _ident(7, 1, b"a")) is True
    assert s.saw(1, _ident(7, 1, b"b")) is False  # (not its first of the epoch)
    assert s.saw(2, _ident(7, 1, b"a")) is True
    assert s.saw(3, _ident(7, 1, b"other")) is True
    assert s.owed(_ident(7, 1, b"a"), {1}) == {2}
    assert s.owed(_ident(7, 1, b"a"), {3}) == set()
    assert s.owed(_ident(7, 1, b"x"), {1, 2}) == set()


def test_a_rank_that_has_not_begun_the_epoch_is_a_peer_if_it_was_in_the_last():
    s = Streams()
    for r in (1, 2, 3):
        s.attach(r)
    s.saw(1, _ident(7, 1, b"a"))
    s.saw(2, _ident(7, 1, b"a"))
    s.saw(3, _ident(7, 1, b"c"))
    s.saw(1, _ident(7, 2, b"a2"))  # rank 1 began epoch 2; 2 and 3 not yet
    assert s.owed(_ident(7, 2, b"a2"), {1}) == {2}  # 2 was 1's peer in epoch 1; 3 was not


def test_the_last_shared_epoch_decides():
    s = Streams()
    s.attach(1)
    s.attach(2)
    s.saw(1, _ident(7, 1, b"a"))
    s.saw(2, _ident(7, 1, b"a"))  # peers in epoch 1
    s.saw(1, _ident(7, 2, b"x"))
    s.saw(2, _ident(7, 2, b"y"))  # not in epoch 2
    s.saw(1, _ident(7, 3, b"z"))
    assert s.owed(_ident(7, 3, b"z"), {1}) == set()
    s2 = Streams()
    s2.attach(1)
    s2.attach(2)
    s2.saw(1, _ident(7, 1, b"x"))
    s2.saw(2, _ident(7, 1, b"y"))  # not in epoch 1
    s2.saw(1, _ident(7, 2, b"a"))
    s2.saw(2, _ident(7, 2, b"a"))  # peers in epoch 2
    s2.saw(1, _ident(7, 3, b"z"))
    assert s2.owed(_ident(7, 3, b"z"), {1}) == {2}


def test_a_rank_with_no_shared_epoch_is_no_peer():
    s = Streams()
    s.attach(1)
    s.attach(2)
    s.saw(1, _ident(7, 1, b"a"))
    s.saw(2, _ident(8, 1, b"a"))  # another base seed: another stream
    s.saw(1, _ident(7, 2, b"b"))
    assert s.owed(_ident(7, 2, b"b"), {1}) == set()


def test_a_taker_not_attached_counts_for_nothing():
    s = Streams()
    s.attach(1)
    s.saw(1, _ident(7, 1, b"a"))
    s.saw(1, _ident(7, 2, b"b"))
    assert s.owed(_ident(7, 2, b"b"), {5}) == set()  # 1 began epoch 2 and 5 is unknown


def test_a_gone_rank_is_owed_nothing_until_it_attaches_again():
    s = Streams()
    s.attach(1)
    s.attach(2)
    s.gone(2)
    assert s.owed(_ident(7, 1), {1}) == set()
    s.attach(2)  # a pid given again: another process
    assert s.owed(_ident(7, 1), {1}) == {2}
    s.attach(2)
    assert s.owed(_ident(7, 1), {1}) == {2}  # (attaching twice keeps what it sent)


def test_attaching_again_keeps_the_first_tasks():
    s = Streams()
    s.attach(1)
    s.attach(2)
    s.saw(2, _ident(7, 1, b"other"))
    s.attach(2)
    assert s.owed(_ident(7, 1, b"a"), {1}) == set()


def test_only_the_last_four_epochs_are_remembered():
    s = Streams()
    s.attach(1)
    for e in range(1, 7):
        assert s.saw(1, _ident(7, e, bytes([e])))
    assert s.saw(1, _ident(7, 6, b"again")) is False
    assert s.saw(1, _ident(7, 3, b"again")) is False  # 3..6 kept
    assert s.saw(1, _ident(7, 1, b"again")) is True  # forgotten: a first again
    assert s.saw(1, _ident(7, 3, b"again")) is True  # (1 came back and pushed 3 out)
    assert s.saw(1, _ident(7, 6, b"again")) is False


def test_four_epochs_stay():
    s = Streams()
    s.attach(1)
    for e in range(1, 5):
        s.saw(1, _ident(7, e))
    for e in range(1, 5):
        assert s.saw(1, _ident(7, e)) is False


def test_a_task_of_a_rank_never_attached_is_recorded():
    s = Streams()
    assert s.saw(4, _ident(7, 1, b"a"))
    s.attach(5)
    s.saw(5, _ident(7, 1, b"a"))
    assert s.owed(_ident(7, 1, b"a"), {5}) == {4}


def test_ranks_not_attached_yet_are_owed_for_a_while():
    s = Streams()
    s.attach(1)
    assert LATER not in s.owed(_ident(7, 1), {1})
    s.expect(2)
    assert s.owed(_ident(7, 1), {1}) == {LATER}
    s._since = time.monotonic() - streams.EXPECT_S - 1
    assert s.owed(_ident(7, 1), {1}) == set()  # waited long enough
    s._since = time.monotonic() - streams.EXPECT_S + 10
    assert s.owed(_ident(7, 1), {1}) == {LATER}
    s.expect(0)
    assert s.owed(_ident(7, 1), {1}) == set()
    s.expect(-3)
    assert s._expected == 0 and s.owed(_ident(7, 1), {1}) == set()
    s.expect(1)
    assert s._expected == 1


def test_owed_now_keeps_of_those_owed_the_ranks_still_peers():
    s = Streams()
    for r in (1, 2, 3):
        s.attach(r)
    held = SimpleNamespace(ident=_ident(7, 1, b"a"), takers={1}, owed={2, 3})
    assert s.owed_now(held) == {2, 3}
    s.saw(3, _ident(7, 1, b"other"))  # 3's first task: no peer
    assert s.owed_now(held) == {2}
    held.owed = {2}
    s.attach(4)  # a newcomer is not added to what was owed ...
    assert s.owed_now(held) == {2}
    held.owed = {2, LATER}  # ... unless ranks not yet attached were expected
    assert s.owed_now(held) == {2, 4}
    s.expect(1)
    assert s.owed_now(held) == {2, 4, LATER}


def test_a_batch_of_an_epoch_the_ranks_were_no_peers_in_is_not_owed():
    s = Streams()
    s.attach(1)
    s.attach(2)
    s.saw(1, _ident(7, 2, b"a"))
    s.saw(2, _ident(7, 2, b"b"))  # not peers in epoch 2 ...
    s.saw(1, _ident(7, 3, b"c"))
    s.saw(2, _ident(7, 3, b"c"))  # ... peers in epoch 3
    assert s.owed(_ident(7, 2, b"a"), {1}) == set()  # a late batch of epoch 2
    assert s.owed(_ident(7, 3, b"c"), {1}) == {2}


def test_a_rank_that_began_another_epoch_is_no_peer_of_an_unknown_taker():
    s = Streams()
    s.attach(1)
    s.saw(1, _ident(7, 1, b"a"))
    assert s.owed(_ident(7, 2, b"b"), {5}) == set()


class _Clock:
    def __init__(self, now):
        self.now = now

    def monotonic(self):
        return self.now


def test_ranks_are_expected_for_expect_s_and_no_longer(monkeypatch):
    clock = _Clock(500.0)
    monkeypatch.setattr(streams, "time", clock)
    s = Streams()
    s.attach(1)
    s.expect(1)
    clock.now = 500.0 + streams.EXPECT_S - 0.001
    assert LATER in s.owed(_ident(7, 1), {1})
    clock.now = 500.0 + streams.EXPECT_S  # exactly EXPECT_S: no longer
    assert LATER not in s.owed(_ident(7, 1), {1})
