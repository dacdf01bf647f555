"""The resume package's parts on their own: the state document, the cursor's position, the
sampler replay and elastic splitting. Loaders are built but never iterated: no processes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

import stoker
from stoker import StateMismatchError
from stoker.config.options import Options
from stoker.config.records import LoaderRecords
from stoker.loader.resume import checkpoint, elastic
from stoker.loader.resume.cursor import Cursor
from stoker.loader.resume.position import Delivered
from stoker.loader.resume.state import VERSION, State
from stoker.wire.events import BatchReady, StreamState

pytestmark = pytest.mark.unit  # no process (tests/support/tiers.py)


def _loader(n=20, **kw):
    return DataLoader(list(range(n)), batch_size=2, shuffle=True,
                      generator=torch.Generator().manual_seed(0), **kw)


def _epoch(cursor, loader):
    """Begins an epoch as an iterator does; returns the sampler stream."""
    return cursor.begin_epoch(iter(loader.batch_sampler), 123).sampler_iter


def test_a_state_round_trips_as_plain_data():
    st = State(loader={"batch_size": 2}, epoch=3, finished=False, position=4,
               delivered_after=(6,), torch_rng=b"\x01", worker_states=((0, b"s"),))
    d = st.to_dict()
    assert d["version"] == VERSION and list(d)[1:-1] == list(State.keys())
    assert list(d)[-1] == "digest" and len(d["digest"]) == 64
    assert State.from_dict(d) == st


def test_a_state_without_a_key_or_of_another_version_is_refused():
    d = State(loader={}).to_dict()
    del d["position"]
    with pytest.raises(StateMismatchError, match="lacks position"):
        State.from_dict(d)
    with pytest.raises(StateMismatchError, match="version 99"):
        State.from_dict({**State(loader={}).to_dict(), "version": 99})
    with pytest.raises(StateMismatchError, match="got list"):
        State.from_dict([1, 2])


def test_delivered_positions_grow_a_prefix_and_keep_the_early_ones():
    d = Delivered()
    for pos in (0, 2, 3, 1, 5):
        d.mark(pos)
    assert d.prefix == 4 and d.extra == {5}


def test_the_cursor_records_what_reached_the_user_and_a_state_resumes_it():
    loader = _loader()
    rec = LoaderRecords()
    cursor = Cursor(loader, rec)
    stream = _epoch(cursor, loader)
    assert rec.epoch == 1  # the one place that advances the epoch
    drawn = []
    for task in range(4):  # a task carries the item the stream drew last
        drawn.append(next(stream))
        cursor.sent(task)
    cursor.delivered(0, 0)
    cursor.delivered(2, 0)  # out of order
    sd = checkpoint.get_state(loader, rec, Options())
    assert sd["position"] == 1 and sd["delivered_after"] == (2,) and sd["batches_yielded"] == 2
    assert not sd["finished"] and sd["epoch"] == 1

    # a fresh loader and records: the state makes the next epoch replay, skipping 0 and 2
    loader2, rec2 = _loader(), LoaderRecords()
    checkpoint.set_state(loader2, rec2, sd)
    assert rec2.epoch == 0 and checkpoint.get_state(loader2, rec2, Options())["position"] == 1
    c2 = Cursor(loader2, rec2)
    assert c2.pending() and c2.base_seed(999) == 123
    rest = list(_epoch(c2, loader2))
    assert rec2.epoch == 1 and not c2.pending()
    assert rest[0] == drawn[1] and rest[1] == drawn[3]  # positions 1 and 3, then the rest
    assert len(rest) == 10 - 2


def test_a_finished_state_begins_the_next_epoch():
    loader, rec = _loader(), LoaderRecords()
    cursor = Cursor(loader, rec)
    list(_epoch(cursor, loader))
    cursor.finished()
    sd = checkpoint.get_state(loader, rec, Options())
    assert sd["finished"] and sd["epoch"] == 1
    rec2 = LoaderRecords()
    checkpoint.set_state(_loader(), rec2, sd)
    assert rec2.epoch == 1 and not Cursor(_loader(), rec2).pending()


def test_a_state_from_a_loader_that_orders_differently_is_refused():
    sd = checkpoint.get_state(_loader(), LoaderRecords(), Options())
    with pytest.raises(StateMismatchError, match="dataset_length: saved 20, here 22"):
        checkpoint.set_state(_loader(22), LoaderRecords(), sd)


def test_the_cursor_keeps_the_streams_state_that_goes_with_each_outcome():
    loader, rec = _loader(), LoaderRecords()
    cursor = Cursor(loader, rec)
    _epoch(cursor, loader)
    cursor.observe(StreamState(1, 5, b"after-5"))
    cursor.observe(BatchReady(1, 5, None))
    assert cursor.restart_state(1) == (True, b"after-5")  # a restart continues from here
    assert cursor.restart_state(0) == (True, None)  # delivered nothing: starts as it did
    cursor.observe(BatchReady(0, 6, None))  # an outcome without a state: a map-style
    assert cursor.restart_state(0) == (True, None)  # dataset's tasks are loaded again
    cursor.delivered(5, 1)
    assert rec.resume.current.streams.received == {1: b"after-5"}


def test_elastic_split_pads_or_cuts_as_distributed_sampler_does():
    order = np.arange(10, dtype=np.int64)
    assert elastic.split(order, 5, False).tolist() == list(range(10))
    assert elastic.split(order, 4, False).tolist() == list(range(10)) + [0, 1]
    assert elastic.split(order, 4, True).tolist() == list(range(8))
    assert elastic.share(np.arange(6, dtype=np.int64).tobytes(), 3, 1) == [1, 4]
    with pytest.raises(StateMismatchError, match="do not divide"):
        elastic.share(np.arange(5, dtype=np.int64).tobytes(), 3, 0)


def test_elastic_merge_gives_each_new_rank_its_share_of_the_rest():
    ds = list(range(24))
    states = []
    delivered = set()
    for r, batches in ((0, 2), (1, 3)):
        s = DistributedSampler(ds, num_replicas=2, rank=r, shuffle=True, seed=5)
        s.set_epoch(1)
        mine = list(s)
        delivered.update(mine[: 2 * batches])
        loader = stoker.DataLoader(ds, batch_size=2, sampler=s)
        it = iter(loader)
        for _ in range(batches):
            next(it)
        states.append(State.from_dict(loader.state_dict()))
    rests = []
    for r in range(3):
        s = DistributedSampler(ds, num_replicas=3, rank=r, shuffle=True, seed=5)
        here = stoker.DataLoader(ds, batch_size=2, sampler=s)
        merged = elastic.merge(here, states)
        assert not merged.finished and merged.position == 0 and merged.distributed["rank"] == r
        rests.append(elastic.share(merged.order, 3, r))
    rest = [i for part in rests for i in part]
    # 14 samples left, padded with the rest's own first sample to 15 (a multiple of 3 ranks)
    assert len(rest) == 15 and set(rest) == set(ds) - delivered


def test_elastic_merge_refuses_an_incomplete_set_of_ranks():
    ds = list(range(8))
    s = DistributedSampler(ds, num_replicas=2, rank=0, shuffle=False)
    loader = stoker.DataLoader(ds, batch_size=2, sampler=s)
    one = State.from_dict(loader.state_dict())
    with pytest.raises(StateMismatchError, match="got ranks \\[0\\] of a 2-rank job"):
        elastic.merge(loader, [one])
