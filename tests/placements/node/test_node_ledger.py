"""stoker.placements.node.ledger with streams: the batches a group sent, kept for a peer that
has not asked yet, within the bound; the way a tensor-parallel pair and a data-parallel pair use
it. Plain records, no process."""

from __future__ import annotations

import pytest

from stoker.placements.node import ledger
from stoker.placements.node.ledger import Ledger
from stoker.placements.node.streams import LATER, Streams

pytestmark = pytest.mark.unit

A, B = 11, 12  # two ranks (their pids)


class Slot:
    """A slot's batch (``PendingBatch``): lent once, given back when the lease goes."""

    def __init__(self, nbytes=100):
        self.nbytes, self.leases = nbytes, 0

    def lend(self):
        self.leases += 1
        return object()


def ident(i, seed=1, epoch=0):
    return (seed, epoch, 0, bytes([i]))


def test_a_pair_with_the_same_stream_keeps_the_batch_until_the_second_took_it():
    s, led = Streams(), Ledger(10, 10**6)
    s.attach(A)
    s.attach(B)
    s.saw(A, ident(0))
    s.saw(B, ident(0))  # the same first task: peers
    held = led.add(ident(1), Slot(), s.owed(ident(1), {A}), pid=7)
    assert held.owed == {B}
    led.gave(held, cid=1, rank=A)
    led.release(held.bid, 1)  # A let go: kept for B
    assert led.find(ident(1)) is held and held.kept_since is not None
    assert led.kept_bytes == 100
    led.gave(held, cid=2, rank=B)  # B asks: the same slot
    assert held.kept_since is None and led.kept_bytes == 0
    led.release(held.bid, 2)
    assert led.find(ident(1)) is None  # nobody else owed: its slot goes back


def test_a_data_parallel_pair_keeps_nothing_for_the_other():
    s, led = Streams(), Ledger(10, 10**6)
    s.attach(A)
    s.attach(B)
    s.saw(A, ident(0))
    s.saw(B, ident(5))  # another stream
    held = led.add(ident(1), Slot(), s.owed(ident(1), {A}), pid=7)
    assert held.owed == set()
    led.gave(held, 1, A)
    led.release(held.bid, 1)
    assert led.find(ident(1)) is None


def test_a_rank_that_has_not_sent_its_first_task_yet_is_owed():
    s, led = Streams(), Ledger(10, 10**6)
    s.attach(A)
    s.attach(B)  # (B new to the group: a peer of everyone until its first task says)
    s.saw(A, ident(0))
    held = led.add(ident(0), Slot(), s.owed(ident(0), {A}), pid=7)
    assert held.owed == {B}
    s.saw(B, ident(9))  # B's first task: another stream
    led.recheck(s.owed_now)
    assert held.owed == set()


def test_ranks_not_attached_yet_are_expected_while_the_job_says_so():
    s = Streams()
    s.attach(A)
    s.expect(1)
    assert s.owed(ident(0), {A}) == {LATER}
    s.expect(0)
    assert s.owed(ident(0), {A}) == set()


def test_the_oldest_kept_batch_goes_first_past_the_bound():
    led = Ledger(2, 10**6)
    kept = []
    for i in range(3):
        h = led.add(ident(i), Slot(), {B}, pid=7)
        led.gave(h, 1, A)
        led.release(h.bid, 1)
        kept.append(h)
    assert [led.find(ident(i)) for i in range(3)] == [None, kept[1], kept[2]]
    small = Ledger(10, 250)  # and by bytes
    for i in range(3):
        h = small.add(ident(i), Slot(100), {B}, pid=7)
        small.settle(h)
    assert small.find(ident(0)) is None and small.kept_bytes == 200


def test_a_rank_whose_process_ended_is_owed_nothing():
    led = Ledger(10, 10**6)
    h = led.add(ident(0), Slot(), {B}, pid=7)
    led.settle(h)
    assert led.find(ident(0)) is h
    led.not_owed(B)
    assert led.find(ident(0)) is None and led.kept_bytes == 0


def test_a_kept_batch_past_its_time_is_let_go(monkeypatch):
    led = Ledger(10, 10**6)
    h = led.add(ident(0), Slot(), {B}, pid=7)
    led.settle(h)
    h.kept_since -= ledger.KEEP_S + 1
    led.recheck(lambda held: held.owed)
    assert led.find(ident(0)) is None


def test_a_connection_that_ends_holds_nothing():
    led = Ledger(10, 10**6)
    h = led.add(ident(0), Slot(), set(), pid=7)
    led.gave(h, 1, A)
    led.gave(h, 1, A)  # (two views on one connection)
    led.drop(1)
    assert led.find(ident(0)) is None
