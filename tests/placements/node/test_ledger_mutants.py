"""stoker.placements.node.ledger: the batches a node group sent to ranks, who holds them and who
is still owed them, kept within bounds."""

from __future__ import annotations

import time

import pytest

from stoker.common import system as _system
from stoker.placements.node import ledger
from stoker.placements.node.ledger import Held, Ledger

pytestmark = pytest.mark.unit  # no process (tests/support/tiers.py)


class Pending:
    """A batch's slot: lend() gives a lease; the lease's death gives the slot back."""

    def __init__(self, nbytes=100):
        self.nbytes = nbytes
        self.leases = []

    def lend(self):
        lease = object()
        self.leases.append(lease)
        return lease


def test_keep_bound_from_the_environment(monkeypatch):
    monkeypatch.setenv("STOKER_NODE_KEEP_MB", "3")
    assert ledger.keep_bound() == (256, 3 * 2**20)
    monkeypatch.setenv("STOKER_NODE_KEEP_MB", "0.5")
    assert ledger.keep_bound() == (256, 2**19)


def test_keep_bound_from_the_memory_left(monkeypatch):
    monkeypatch.delenv("STOKER_NODE_KEEP_MB", raising=False)
    monkeypatch.setattr(_system, "memory_headroom", lambda: (2**30, 2**31))
    assert ledger.keep_bound() == (256, 2**26)  # 1/16
    monkeypatch.setattr(_system, "memory_headroom", lambda: (2**40, 2**41))
    assert ledger.keep_bound() == (256, 2**30)  # at most 1 GiB
    monkeypatch.setattr(_system, "memory_headroom", lambda: (None, None))
    assert ledger.keep_bound() == (256, 2**30)  # unknown: 16 GiB assumed, so 1 GiB
    monkeypatch.setattr(_system, "memory_headroom", lambda: (0, 2**30))
    assert ledger.keep_bound() == (256, 2**30)  # (0 is taken for unknown)
    monkeypatch.setattr(_system, "memory_headroom", lambda: (2**33 + 16, None))
    assert ledger.keep_bound() == (256, 2**29 + 1)


def test_keep_s():
    assert ledger.KEEP_S == 120.0


def test_a_batch_added_is_lent_and_found_by_its_ident():
    lg = Ledger(4, 1000)
    assert (lg.keep_batches, lg.keep_bytes, lg.kept_bytes) == (4, 1000, 0)
    p = Pending(64)
    owed = {5}
    held = lg.add(("s", 1), p, owed, pid=321)
    assert isinstance(held, Held)
    assert held.ident == ("s", 1) and held.pending is p and held.lease is p.leases[0]
    assert held.nbytes == 64 and held.pid == 321 and held.owed == {5}
    owed.add(6)
    assert held.owed == {5}  # (its own copy)
    assert not held.holders and held.takers == set() and held.kept_since is None
    assert lg.find(("s", 1)) is held
    assert lg.find(("s", 2)) is None
    other = lg.add(("s", 2), Pending(), set(), pid=1)
    assert other.bid > held.bid
    assert lg.find(("s", 2)) is other


def test_a_batch_given_is_held_and_no_longer_owed_to_that_rank():
    lg = Ledger(4, 1000)
    held = lg.add(("s", 1), Pending(), {7, 8}, pid=1)
    lg.gave(held, cid=10, rank=7)
    lg.gave(held, cid=10, rank=7)
    assert held.holders[10] == 2 and held.takers == {7} and held.owed == {8}
    lg.release(held.bid, 10)
    assert held.holders[10] == 1
    lg.release(held.bid, 10)
    assert 10 not in held.holders and not held.holders
    # nobody holds it, rank 8 is owed it: kept
    assert lg.find(("s", 1)) is held and held.kept_since is not None
    assert lg.kept_bytes == 100
    lg.gave(held, cid=11, rank=8)  # rank 8 takes it: no longer kept
    assert held.kept_since is None and lg.kept_bytes == 0 and held.owed == set()
    lg.release(held.bid, 11)
    assert lg.find(("s", 1)) is None  # nobody holds it, nobody owed: forgotten
    assert lg.kept_bytes == 0


def test_a_release_of_what_is_not_held_changes_nothing():
    lg = Ledger(4, 1000)
    held = lg.add(("s", 1), Pending(), set(), pid=1)
    lg.gave(held, 1, 7)
    lg.release(held.bid, 2)  # another connection holds none
    lg.release(held.bid + 1000, 1)  # no such batch
    assert held.holders == {1: 1} and lg.find(("s", 1)) is held
    lg.release(held.bid, 1)
    assert lg.find(("s", 1)) is None
    lg.release(held.bid, 1)  # (gone already)


def test_settle_forgets_a_batch_nobody_holds_or_is_owed():
    lg = Ledger(4, 1000)
    held = lg.add(("s", 1), Pending(), set(), pid=1)
    lg.settle(held)
    assert lg.find(("s", 1)) is None and lg.kept_bytes == 0
    h2 = lg.add(("s", 2), Pending(), set(), pid=1)
    lg.gave(h2, 1, 7)
    lg.settle(h2)  # held: stays
    assert lg.find(("s", 2)) is h2 and h2.kept_since is None


def test_a_kept_batch_is_kept_once():
    lg = Ledger(4, 1000)
    held = lg.add(("s", 1), Pending(30), {9}, pid=1)
    lg.settle(held)
    since = held.kept_since
    assert since is not None and lg.kept_bytes == 30
    lg.settle(held)
    assert held.kept_since == since and lg.kept_bytes == 30


def test_kept_batches_are_bounded_in_number_oldest_first():
    lg = Ledger(2, 10**6)
    hs = [lg.add(("s", i), Pending(10), {9}, pid=1) for i in range(3)]
    for h in hs:
        lg.settle(h)
    assert lg.find(("s", 0)) is None
    assert lg.find(("s", 1)) is hs[1] and lg.find(("s", 2)) is hs[2]
    assert lg.kept_bytes == 20


def test_kept_batches_are_bounded_in_bytes_oldest_first():
    lg = Ledger(100, 25)
    hs = [lg.add(("s", i), Pending(10), {9}, pid=1) for i in range(3)]
    lg.settle(hs[0])
    lg.settle(hs[1])
    assert lg.kept_bytes == 20
    lg.settle(hs[2])  # 30 > 25: the oldest goes
    assert lg.find(("s", 0)) is None and lg.kept_bytes == 20
    assert lg.find(("s", 1)) is hs[1]
    lg2 = Ledger(2, 20)
    a, b = (lg2.add(("t", i), Pending(10), {9}, pid=1) for i in range(2))
    lg2.settle(a)
    lg2.settle(b)  # exactly at both bounds: both stay
    assert lg2.find(("t", 0)) is a and lg2.find(("t", 1)) is b and lg2.kept_bytes == 20


def test_a_batch_kept_then_taken_is_no_longer_among_the_oldest():
    lg = Ledger(1, 10**6)
    a = lg.add(("s", 0), Pending(10), {8, 9}, pid=1)
    lg.settle(a)
    lg.gave(a, 1, 8)  # taken again: not kept
    b = lg.add(("s", 1), Pending(10), {9}, pid=1)
    lg.settle(b)
    assert lg.find(("s", 0)) is a and lg.find(("s", 1)) is b
    assert lg.kept_bytes == 10


def test_a_dropped_connection_holds_nothing():
    lg = Ledger(4, 1000)
    a = lg.add(("s", 0), Pending(), set(), pid=1)
    b = lg.add(("s", 1), Pending(), {9}, pid=1)
    c = lg.add(("s", 2), Pending(), set(), pid=1)
    for h in (a, b, c):
        lg.gave(h, 1, 7)
        lg.gave(h, 1, 7)
    lg.gave(c, 2, 8)
    lg.drop(1)
    assert lg.find(("s", 0)) is None  # nobody holds or is owed it
    assert lg.find(("s", 1)) is b and b.kept_since is not None  # kept for rank 9
    assert lg.find(("s", 2)) is c and c.holders == {2: 1}  # another connection holds it
    lg.drop(3)  # (holds nothing)
    assert lg.find(("s", 2)) is c


def test_a_rank_gone_is_owed_nothing():
    lg = Ledger(4, 1000)
    a = lg.add(("s", 0), Pending(), {9}, pid=1)
    b = lg.add(("s", 1), Pending(), {9, 8}, pid=1)
    c = lg.add(("s", 2), Pending(), {9}, pid=1)
    lg.gave(c, 1, 7)
    for h in (a, b):
        lg.settle(h)
    lg.not_owed(9)
    assert lg.find(("s", 0)) is None
    assert lg.find(("s", 1)) is b and b.owed == {8}
    assert lg.find(("s", 2)) is c and c.owed == set()  # held still
    lg.not_owed(5)
    assert lg.find(("s", 1)) is b


def test_recheck_sets_what_is_owed_and_lets_go_of_old_kept_batches():
    lg = Ledger(4, 1000)
    a = lg.add(("s", 0), Pending(), {9}, pid=1)
    b = lg.add(("s", 1), Pending(), {9}, pid=1)
    c = lg.add(("s", 2), Pending(), {9}, pid=1)
    for h in (a, b, c):
        lg.settle(h)
    b.kept_since = time.monotonic() - ledger.KEEP_S - 1  # kept too long
    c.kept_since = time.monotonic() - ledger.KEEP_S + 30
    seen = []

    def owed_now(held):
        seen.append(held.bid)
        return {9} if held is not a else set()

    lg.recheck(owed_now)
    assert sorted(seen) == sorted([a.bid, b.bid, c.bid])
    assert lg.find(("s", 0)) is None  # no longer owed
    assert lg.find(("s", 1)) is None  # kept past KEEP_S
    assert lg.find(("s", 2)) is c and c.owed == {9}
    assert lg.kept_bytes == 100


def test_recheck_keeps_a_held_batch():
    lg = Ledger(4, 1000)
    a = lg.add(("s", 0), Pending(), set(), pid=1)
    lg.gave(a, 1, 7)
    lg.recheck(lambda held: {5})
    assert lg.find(("s", 0)) is a and a.owed == {5}


def test_clear():
    lg = Ledger(4, 1000)
    a = lg.add(("s", 0), Pending(), {9}, pid=1)
    lg.settle(a)
    lg.clear()
    assert lg.find(("s", 0)) is None and lg.kept_bytes == 0
    assert lg._by_id == {} and lg._kept == {}


def test_a_newer_batch_of_the_same_ident_stays_findable():
    lg = Ledger(4, 1000)
    old = lg.add(("s", 0), Pending(), set(), pid=1)
    lg.gave(old, 1, 7)
    new = lg.add(("s", 0), Pending(), set(), pid=1)  # loaded again
    lg.gave(new, 2, 8)
    lg.release(old.bid, 1)  # the old one goes: the ident is the new one's
    assert lg.find(("s", 0)) is new
    lg.release(new.bid, 2)
    assert lg.find(("s", 0)) is None


def test_unkeep_of_a_batch_no_longer_kept_leaves_the_bytes():
    lg = Ledger(4, 1000)
    a = lg.add(("s", 0), Pending(40), {9}, pid=1)
    b = lg.add(("s", 1), Pending(50), {9}, pid=1)
    lg.settle(a)
    lg.settle(b)
    assert lg.kept_bytes == 90
    lg._kept.pop(a.bid)  # (as if already let go)
    lg._unkeep(a)
    assert lg.kept_bytes == 90 and a.kept_since is None
    lg._unkeep(b)
    assert lg.kept_bytes == 40


@pytest.mark.parametrize("n", [1, 3])
def test_release_of_every_view_of_a_batch_owed_to_nobody_forgets_it(n):
    lg = Ledger(4, 1000)
    a = lg.add(("s", 0), Pending(), set(), pid=1)
    for _ in range(n):
        lg.gave(a, 1, 7)
    for i in range(n):
        assert lg.find(("s", 0)) is a, i
        lg.release(a.bid, 1)
    assert lg.find(("s", 0)) is None


def test_keep_bound_is_whole_bytes(monkeypatch):
    monkeypatch.delenv("STOKER_NODE_KEEP_MB", raising=False)
    monkeypatch.setattr(_system, "memory_headroom", lambda: (17, 2**30))
    bound = ledger.keep_bound()
    assert bound == (256, 1) and type(bound[1]) is int


def test_a_forgotten_batch_leaves_no_trace():
    lg = Ledger(4, 1000)
    a = lg.add(("s", 0), Pending(), set(), pid=1)
    lg.gave(a, 1, 7)
    lg.release(a.bid, 1)
    assert lg._by_id == {} and lg._by_ident == {} and lg._kept == {}
    seen = []
    lg.recheck(lambda held: seen.append(held) or set())
    assert seen == []


class _Clock:
    def __init__(self, now):
        self.now = now

    def monotonic(self):
        return self.now


def test_a_batch_is_kept_for_keep_s_and_no_longer(monkeypatch):
    clock = _Clock(1000.0)
    monkeypatch.setattr(ledger, "time", clock)
    lg = Ledger(4, 1000)
    a = lg.add(("s", 0), Pending(), {9}, pid=1)
    lg.settle(a)
    assert a.kept_since == 1000.0
    clock.now = 1000.0 + ledger.KEEP_S  # exactly KEEP_S: still kept
    lg.recheck(lambda held: {9})
    assert lg.find(("s", 0)) is a
    clock.now += 0.001
    lg.recheck(lambda held: {9})
    assert lg.find(("s", 0)) is None
