"""stoker.loader.resume.position: where an epoch is (positions delivered, workers' states), the counted
sampler stream, and the loader's resume point (with stoker 0.1's tracker read in)."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest
import torch

from stoker.loader.resume import order as _order
from stoker.loader.resume.position import (
    Delivered,
    EpochPosition,
    ResumePoint,
    SamplerStream,
    Streams,
    point_of,
)
from stoker.loader.resume.state import State

pytestmark = pytest.mark.unit  # no process (tests/support/tiers.py)


def test_delivered_grows_a_prefix_and_keeps_what_came_early():
    d = Delivered()
    assert (d.prefix, d.extra, d.yielded, d.finished) == (0, set(), 0, False)
    d.mark(2)
    d.mark(4)
    assert (d.prefix, d.extra) == (0, {2, 4})
    d.mark(0)
    assert (d.prefix, d.extra) == (1, {2, 4})
    d.mark(1)
    assert (d.prefix, d.extra) == (3, {4})  # 1, then 2 from the extras
    d.mark(1)  # (already in the prefix)
    assert (d.prefix, d.extra) == (3, {4})
    d.mark(3)
    assert (d.prefix, d.extra) == (5, set())


def test_each_epoch_position_has_its_own_parts():
    a, b = EpochPosition(1, 5), EpochPosition(1, 5)
    a.delivered.mark(0)
    a.streams.received[0] = "s"
    a.task_pos[3] = 1
    a.sampler_states["x"] = 1
    assert b.delivered.prefix == 0 and b.streams.received == {} and b.task_pos == {}
    assert b.sampler_states == {}
    assert (b.torch_rng, b.generators, b.sampler_epoch, b.order, b.replay, b.skip_prefix,
            b.skip_extra, b.workers) == (None, (), None, None, False, 0, frozenset(), None)
    s = Streams()
    assert (s.received, s.last_worker, s.by_task, s.arrived, s.arrived_from) == (
        {}, None, {}, {}, set())


def test_a_sampler_stream_counts_and_records_torchs_rng_at_its_first_draw():
    torch.manual_seed(3)
    rec = EpochPosition(1, 0)
    s = SamplerStream(iter("abc"), rec)
    assert iter(s) is s and s.pos == -1
    before = torch.get_rng_state()
    assert next(s) == "a" and s.pos == 0
    assert rec.torch_rng == _order.rng_bytes(before)
    torch.rand(1)  # (the rng moves on: the record keeps the first draw's)
    assert next(s) == "b" and s.pos == 1
    assert rec.torch_rng == _order.rng_bytes(before)
    assert next(s) == "c"
    try:
        next(s)
        raise AssertionError("no StopIteration")
    except StopIteration:
        pass


def test_a_replayed_stream_draws_its_first_item_under_the_saved_rng_and_skips_what_was_delivered():
    torch.manual_seed(1)
    saved = torch.get_rng_state()
    torch.manual_seed(2)
    mine = torch.get_rng_state()

    def draws():
        for i in range(8):
            yield (i, float(torch.rand(1)))

    rec = EpochPosition(1, 0, torch_rng=_order.rng_bytes(saved), replay=True, skip_prefix=2,
                        skip_extra=frozenset({3, 5}))
    s = SamplerStream(draws(), rec)
    first = next(s)
    assert first[0] == 2 and s.pos == 2
    assert torch.equal(torch.get_rng_state(), mine)  # the caller's RNG as it was
    assert rec.torch_rng == _order.rng_bytes(saved)  # (not replaced)
    assert [i for i, _ in s] == [4, 6, 7]
    torch.set_rng_state(saved)
    want = [float(torch.rand(1)) for _ in range(3)]
    assert first[1] == want[2]  # drawn under the saved RNG, 0 and 1 dropped


def test_a_replay_without_a_saved_rng_records_the_one_now():
    torch.manual_seed(5)
    now = torch.get_rng_state()
    rec = EpochPosition(1, 0, replay=True, skip_prefix=1)
    s = SamplerStream(iter(range(3)), rec)
    assert next(s) == 1 and rec.torch_rng == _order.rng_bytes(now)


def test_a_replay_whose_first_draw_raises_still_puts_the_rng_back():
    torch.manual_seed(1)
    saved = torch.get_rng_state()
    torch.manual_seed(9)
    mine = torch.get_rng_state()
    rec = EpochPosition(1, 0, torch_rng=_order.rng_bytes(saved), replay=True)
    s = SamplerStream(iter(()), rec)
    try:
        next(s)
    except StopIteration:
        pass
    assert torch.equal(torch.get_rng_state(), mine)


def test_a_resume_point_starts_empty_and_pickles():
    p = ResumePoint()
    assert (p.current, p.pending, p.carry, p.carry_workers, p.next_rng, p.next_seed) == (
        None, None, {}, None, None, None)
    p.carry = {0: "x"}
    p.next_seed = 4
    q = pickle.loads(pickle.dumps(p))
    assert q.carry == {0: "x"} and q.next_seed == 4 and q.next_rng is None


def test_a_resume_point_pickled_before_the_new_fields_gets_them():
    p = ResumePoint.__new__(ResumePoint)
    p.__setstate__({"current": "c", "pending": None})
    assert (p.current, p.pending, p.carry, p.carry_workers, p.next_rng, p.next_seed) == (
        "c", None, {}, None, None, None)
    p2 = ResumePoint.__new__(ResumePoint)
    p2.__setstate__({"current": None, "pending": None, "carry": {1: 2}, "carry_workers": 3,
                     "next_rng": b"r", "next_seed": 9})
    assert (p2.carry, p2.carry_workers, p2.next_rng, p2.next_seed) == ({1: 2}, 3, b"r", 9)


def test_point_of_makes_one_on_first_use_and_keeps_it():
    records = SimpleNamespace(resume=None)
    p = point_of(records)
    assert isinstance(p, ResumePoint) and records.resume is p
    assert point_of(records) is p
    assert p.current is None and p.pending is None


def test_point_of_reads_a_legacy_tracker():
    current = SimpleNamespace(epoch=3, base_seed=11, torch_rng=b"t", generators=(b"g",),
                              sampler_epoch=2, order=b"o", prefix=4, extra=(6, 7), yielded=2,
                              finished=True, worker_states={0: "w"}, last_worker=1)
    pending = {"epoch": 3, "finished": False, "position": 5, "base_seed": 11,
               "worker_states": ((0, "w"),)}
    old = SimpleNamespace(current=current, pending=pending)
    records = SimpleNamespace(resume=old)
    p = point_of(records)
    assert records.resume is p and isinstance(p, ResumePoint)
    c = p.current
    assert isinstance(c, EpochPosition)
    assert (c.epoch, c.base_seed, c.torch_rng, c.generators, c.sampler_epoch, c.order) == (
        3, 11, b"t", (b"g",), 2, b"o")
    d = c.delivered
    assert (d.prefix, d.extra, d.yielded, d.finished) == (4, {6, 7}, 2, True)
    assert isinstance(d.extra, set)
    assert c.streams.received == {0: "w"} and c.streams.last_worker == 1
    assert c.streams.received is not current.worker_states  # (a copy)
    st = p.pending
    assert isinstance(st, State) and st.loader == {}
    assert (st.epoch, st.finished, st.position, st.base_seed, st.worker_states) == (
        3, False, 5, 11, ((0, "w"),))
    # the fields the legacy pending lacks take the State's defaults
    assert (st.delivered_after, st.batches_yielded, st.torch_rng, st.generators,
            st.sampler_epoch, st.order, st.last_worker, st.workers, st.sampler_states) == (
        (), 0, None, (), None, None, None, None, {})


def test_a_legacy_tracker_with_only_the_oldest_fields():
    current = SimpleNamespace(epoch=1, base_seed=2)
    records = SimpleNamespace(resume=SimpleNamespace(current=current))
    c = point_of(records).current
    assert (c.torch_rng, c.generators, c.sampler_epoch, c.order) == (None, (), None, None)
    d = c.delivered
    assert (d.prefix, d.extra, d.yielded, d.finished) == (0, set(), 0, False)
    assert c.streams.received == {} and c.streams.last_worker is None
    assert records.resume.pending is None


def test_a_legacy_tracker_without_an_epoch():
    records = SimpleNamespace(resume=SimpleNamespace(current=None, pending=None))
    p = point_of(records)
    assert p.current is None and p.pending is None


def test_a_legacy_pending_state_begins_its_epoch():
    """A loader pickled by stoker 0.1 with a loaded state pending: its sampler states are {}
    (they were None, and the next epoch's prepare_epoch raised TypeError)."""
    from torch.utils.data import DataLoader

    from stoker.config.records import LoaderRecords
    from stoker.loader.resume.cursor import Cursor

    loader = DataLoader(list(range(8)), batch_size=2)
    records = LoaderRecords()
    records.resume = SimpleNamespace(current=None, pending={
        "epoch": 1, "finished": False, "position": 2, "base_seed": 5, "batches_yielded": 2})
    cursor = Cursor(loader, records)
    cursor.prepare_epoch()
    start = cursor.begin_epoch(iter(loader.batch_sampler), 99)
    assert start.base_seed == 5
    assert list(start.sampler_iter) == [[4, 5], [6, 7]]
