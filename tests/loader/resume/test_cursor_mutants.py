"""stoker.loader.resume.cursor: the only writer of an epoch's position, told what an iterator does
(epochs begin, tasks go and come, workers die), with a state pending or carried. Loaders are
built, never iterated: no process."""

from __future__ import annotations

import logging

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

from stoker import StateMismatchError
from stoker.config.records import LoaderRecords
from stoker.loader.resume import order as _order
from stoker.loader.resume.cursor import Cursor, EpochStart
from stoker.loader.resume.position import ResumePoint
from stoker.loader.resume.state import State
from stoker.wire.events import BatchReady, StreamState

pytestmark = [pytest.mark.unit,  # no process (tests/support/tiers.py)
              pytest.mark.filterwarnings("ignore:This DataLoader will create")]


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(6))


class StatefulMap(torch.utils.data.Dataset):
    def __init__(self):
        self.loaded = []

    def __len__(self):
        return 12

    def __getitem__(self, i):
        return i

    def state_dict(self):
        return {"n": 1}

    def load_state_dict(self, sd):
        self.loaded.append(sd)


class StatefulStream(Stream):
    def __init__(self):
        self.loaded = []

    def state_dict(self):
        return {"s": 1}

    def load_state_dict(self, sd):
        self.loaded.append(sd)


class StatefulSampler:
    def __init__(self, n=12):
        self.n, self.state = n, 0

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self):
        return self.n

    def state_dict(self):
        return {"state": self.state}

    def load_state_dict(self, sd):
        self.state = sd["state"]


def _cursor(loader):
    """(a cursor of `loader`, its records); the cursor holds the loader weakly: keep it."""
    rec = LoaderRecords()
    return Cursor(loader, rec), rec


def _map(n=12, **kw):
    kw.setdefault("batch_size", 2)
    return DataLoader(list(range(n)), **kw)


def _begin(cursor, loader, seed=7):
    cursor.prepare_epoch()
    return cursor.begin_epoch(iter(loader.batch_sampler if loader.batch_sampler is not None
                                   else loader.sampler), seed)


def _pending(**kw) -> State:
    kw.setdefault("epoch", 1)
    kw.setdefault("finished", False)
    return State(loader={}, **kw)


# -- making it -------------------------------------------------------------------------------------
def test_a_new_cursor():
    loader = _map()
    c, rec = _cursor(loader)
    assert isinstance(rec.resume, ResumePoint) and c.record is None and c.loader is loader
    assert not c.pending() and not c.loaded()
    assert c.base_seed(42) == 42
    assert c.restart_state(0) == (False, None) and not c.can_restart_stream(0)


def test_base_seed_of_a_pending_resume_is_the_saved_epochs():
    loader = _map()
    c, rec = _cursor(loader)
    rec.resume.pending = _pending(base_seed=5)
    assert c.pending() and c.loaded() and c.base_seed(42) == 5


def test_loaded_says_a_carried_state_or_a_next_rng_waits():
    loader = _map()
    c, rec = _cursor(loader)
    rec.resume.carry = {0: {"dataset": 1}}
    assert c.loaded() and not c.pending()
    rec.resume.carry = {}
    rec.resume.next_rng = b"x"
    assert c.loaded()


# -- the base seed's draw ---------------------------------------------------------------------------
def test_with_a_resume_pending_the_draw_leaves_torchs_rng_alone():
    loader = _map()
    c, rec = _cursor(loader)
    rec.resume.pending = _pending(base_seed=5)
    torch.manual_seed(3)
    before = torch.get_rng_state()
    with c.drawing_base_seed():
        torch.rand(4)
    assert torch.equal(torch.get_rng_state(), before)


def test_without_one_the_draw_moves_it():
    loader = _map()
    c, _ = _cursor(loader)
    torch.manual_seed(3)
    before = torch.get_rng_state()
    with c.drawing_base_seed():
        torch.rand(4)
    assert not torch.equal(torch.get_rng_state(), before)
    assert c.base_seed(11) == 11


def test_a_raise_in_the_draw_still_puts_the_rng_back():
    loader = _map()
    c, rec = _cursor(loader)
    rec.resume.pending = _pending()
    torch.manual_seed(3)
    before = torch.get_rng_state()
    with pytest.raises(RuntimeError):
        with c.drawing_base_seed():
            torch.rand(4)
            raise RuntimeError("x")
    assert torch.equal(torch.get_rng_state(), before)


def test_a_loaded_finished_state_draws_from_its_rng_when_the_callers_differs():
    loader = _map(shuffle=True)
    c, rec = _cursor(loader)
    torch.manual_seed(1)
    saved = torch.get_rng_state()
    g = torch.Generator()
    g.set_state(saved)
    want_seed = int(torch.empty((), dtype=torch.int64).random_(generator=g).item())
    want_replay = _order.rng_bytes(g.get_state())
    rec.resume.next_rng = _order.rng_bytes(saved)
    torch.manual_seed(2)  # the caller's RNG is elsewhere
    mine = torch.get_rng_state()
    with c.drawing_base_seed():
        drawn = int(torch.empty((), dtype=torch.int64).random_().item())
    assert torch.equal(torch.get_rng_state(), mine)  # left alone
    assert c.base_seed(drawn) == want_seed
    assert c._replay_rng == want_replay
    start = _begin(c, loader, seed=c.base_seed(drawn))
    assert start.base_seed == want_seed
    assert c.record.torch_rng == want_replay and c.record.replay
    assert c._replay_rng is None and rec.resume.next_rng is None
    # the shuffle draws as the saved run's did: under the RNG after its base seed's draw
    torch.set_rng_state(_order.rng_tensor(want_replay))
    expected = list(iter(loader.batch_sampler))
    torch.set_rng_state(mine)
    assert list(start.sampler_iter) == expected
    assert torch.equal(torch.get_rng_state(), mine)


def test_a_loaded_finished_state_with_the_callers_rng_as_it_was_draws_naturally():
    loader = _map()
    c, rec = _cursor(loader)
    torch.manual_seed(1)
    rec.resume.next_rng = _order.rng_bytes(torch.get_rng_state())
    with c.drawing_base_seed():
        torch.rand(1)
    assert c._chosen_seed is None and c._replay_rng is None
    torch.manual_seed(1)
    torch.rand(1)
    after = torch.get_rng_state()
    assert c.base_seed(99) == 99
    c2, rec2 = _cursor(loader)
    torch.manual_seed(1)
    rec2.resume.next_rng = _order.rng_bytes(torch.get_rng_state())
    with c2.drawing_base_seed():
        torch.rand(1)
    assert torch.equal(torch.get_rng_state(), after)  # the draw moved the caller's RNG


def test_a_persistent_iterators_saved_seed_is_kept():
    loader = _map()
    c, rec = _cursor(loader)
    torch.manual_seed(1)
    rng = _order.rng_bytes(torch.get_rng_state())
    rec.resume.next_rng, rec.resume.next_seed = rng, 1234
    mine = torch.get_rng_state()  # (the same RNG: the saved seed still decides)
    with c.drawing_base_seed():
        torch.rand(3)
    assert torch.equal(torch.get_rng_state(), mine)
    assert c.base_seed(5) == 1234 and c._replay_rng == rng


def test_a_second_draw_forgets_the_first_ones_choice():
    loader = _map()
    c, rec = _cursor(loader)
    rec.resume.next_rng, rec.resume.next_seed = _order.rng_bytes(torch.get_rng_state()), 9
    with c.drawing_base_seed():
        pass
    assert c.base_seed(1) == 9
    rec.resume.next_rng = rec.resume.next_seed = None
    with c.drawing_base_seed():
        pass
    assert c.base_seed(1) == 1 and c._replay_rng is None


# -- the states workers restore ---------------------------------------------------------------------
def test_num_workers_0s_dataset_gets_a_carried_state_before_the_draw():
    ds = StatefulMap()
    loader = DataLoader(ds, batch_size=2)
    c, rec = _cursor(loader)
    rec.resume.carry = {0: {"dataset": {"n": 5}, "position": 3}}
    rec.resume.carry_workers = 0
    with c.drawing_base_seed():
        pass
    assert ds.loaded == [{"n": 5}] and c._main_restored
    start = _begin(c, loader)
    assert ds.loaded == [{"n": 5}]  # (not twice)
    assert start.stream_states == {} and not c._main_restored
    assert rec.resume.carry == {} and rec.resume.carry_workers is None


def test_a_carried_state_with_more_than_the_dataset_keeps_the_rest():
    ds = StatefulMap()
    loader = DataLoader(ds, batch_size=2)
    c, rec = _cursor(loader)
    rng = {"random": None}
    rec.resume.carry = {0: {"dataset": {"n": 5}, "rng": rng}}
    rec.resume.carry_workers = 0
    with c.drawing_base_seed():
        pass
    start = _begin(c, loader)
    assert start.stream_states == {0: {"rng": rng}}
    assert c.record.streams.received == {0: {"rng": rng}}


def test_a_carried_state_without_a_dataset_restores_nothing_before_the_draw():
    ds = StatefulMap()
    loader = DataLoader(ds, batch_size=2)
    c, rec = _cursor(loader)
    rec.resume.carry = {0: {"rng": {"random": None}}}
    with c.drawing_base_seed():
        pass
    assert ds.loaded == [] and not c._main_restored
    rec.resume.carry = {1: {"dataset": {"n": 1}}}  # not worker 0's
    with c.drawing_base_seed():
        pass
    assert ds.loaded == [] and not c._main_restored


def test_worker_processes_datasets_are_not_restored_here():
    ds = StatefulMap()
    loader = DataLoader(ds, batch_size=2, num_workers=2, persistent_workers=True)
    c, rec = _cursor(loader)
    rec.resume.carry = {0: {"dataset": {"n": 5}}}
    rec.resume.carry_workers = 2
    with c.drawing_base_seed():
        pass
    assert ds.loaded == [] and not c._main_restored
    assert c.starting_stream_states() == {0: {"dataset": {"n": 5}}}


def test_a_pending_resume_leaves_the_dataset_to_the_epoch():
    ds = StatefulMap()
    loader = DataLoader(ds, batch_size=2)
    c, rec = _cursor(loader)
    rec.resume.pending = _pending()
    rec.resume.carry = {0: {"dataset": {"n": 5}}}
    with c.drawing_base_seed():
        pass
    assert ds.loaded == []


def test_starting_states_of_a_pending_resume():
    loader = DataLoader(Stream(), batch_size=2, num_workers=2)
    c, rec = _cursor(loader)
    states = ((0, {"dataset": 1}), (1, {"iterator": 2}))
    rec.resume.pending = _pending(worker_states=states, workers=2)
    assert c.starting_stream_states() == {0: {"dataset": 1}, 1: {"iterator": 2}}


def test_a_stream_that_cannot_be_positioned_restores_nothing():
    loader = DataLoader(Stream(), batch_size=2, num_workers=2)
    c, rec = _cursor(loader)
    rec.resume.pending = _pending(worker_states=((0, {"position": 3, "rng": None}),), workers=2)
    assert c.starting_stream_states() == {}
    rec.resume.pending = _pending(worker_states=((0, {"self": 3}),), workers=2)
    assert c.starting_stream_states() == {0: {"self": 3}}


def test_a_map_style_datasets_states_are_kept_without_stream_states():
    loader = _map(num_workers=2)
    c, rec = _cursor(loader)
    rec.resume.pending = _pending(worker_states=((0, {"rng": None}),), workers=2)
    assert c.starting_stream_states() == {0: {"rng": None}}


def test_states_saved_with_no_workers_count():
    loader = _map(num_workers=2)
    c, rec = _cursor(loader)
    rec.resume.pending = _pending(worker_states=((0, {"rng": 1}),), workers=None)
    assert c.starting_stream_states() == {0: {"rng": 1}}


def test_states_of_another_num_workers_are_dropped_with_a_warning(caplog):
    loader = _map(num_workers=2)
    c, rec = _cursor(loader)
    rec.resume.pending = _pending(worker_states=((0, {"rng": 1}),), workers=3)
    with caplog.at_level(logging.WARNING, logger="stoker"):
        assert c.starting_stream_states() == {}
    assert caplog.records == []  # (starting_stream_states does not warn)
    with caplog.at_level(logging.WARNING, logger="stoker"):
        assert c._usable({0: {"rng": 1}}, 3, loader) == {}
    assert [r.getMessage() for r in caplog.records] == [
        "stoker: this state was saved with num_workers=3 and is resumed with 2: the samples and "
        "their order continue exactly, but the workers' own states (a dataset's state_dict, the "
        "random generators of augmentation under torch's seeding) start afresh. Resume with "
        "num_workers=3 for bit-identical values, or use seed=\"per_sample\", whose values do not "
        "depend on the workers."]
    assert caplog.records[0].levelno == logging.WARNING and caplog.records[0].name == "stoker"


def test_usable_states():
    loader = _map(num_workers=2)
    c, _ = _cursor(loader)
    assert c._usable(None, 2, loader) == {}
    assert c._usable({}, 5, loader, warn=False) == {}
    got = c._usable(((1, {"a": 1}),), 2, loader)
    assert got == {1: {"a": 1}} and isinstance(got, dict)
    d = {1: {"a": 1}}
    assert c._usable(d, 2, loader) is not d  # (a copy)


def test_a_map_style_datasets_state_saved_without_workers_goes_into_the_dataset():
    ds = StatefulMap()
    loader = DataLoader(ds, batch_size=2, num_workers=2)
    c, _ = _cursor(loader)
    assert c._usable({0: {"dataset": {"n": 3}, "rng": 1}}, 0, loader) == {}
    assert ds.loaded == [{"n": 3}]
    assert c._usable({0: {"rng": 1}}, 0, loader, warn=False) == {}  # no dataset: dropped
    assert ds.loaded == [{"n": 3}]
    stream = StatefulStream()
    sloader = DataLoader(stream, batch_size=2, num_workers=2)
    c2, _ = _cursor(sloader)
    assert c2._usable({0: {"dataset": {"n": 3}}}, 0, sloader, warn=False) == {}
    assert stream.loaded == []  # (a stream's state is its worker's)


def test_carried_states_go_to_persistent_workers_only():
    persistent = _map(num_workers=2, persistent_workers=True)
    c, rec = _cursor(persistent)
    rec.resume.carry = {0: {"dataset": 1, "position": 4, "ended": True}, 1: {"position": 2}}
    rec.resume.carry_workers = 2
    assert c.starting_stream_states() == {0: {"dataset": 1}}  # into the next epoch
    plain = _map(num_workers=2)
    c2, rec2 = _cursor(plain)
    rec2.resume.carry, rec2.resume.carry_workers = {0: {"dataset": 1}}, 2
    assert c2.starting_stream_states() == {}
    zero = _map()
    c3, rec3 = _cursor(zero)
    rec3.resume.carry, rec3.resume.carry_workers = {0: {"dataset": 1}}, 0
    assert c3.starting_stream_states() == {0: {"dataset": 1}}
    rec3.resume.carry_workers = 2  # taken with other workers: not restored
    assert c3.starting_stream_states() == {}


# -- epochs -------------------------------------------------------------------------------------------
def test_prepare_epoch_takes_the_samplers_states():
    sampler = StatefulSampler()
    loader = _map(sampler=sampler)
    c, rec = _cursor(loader)
    sampler.state = 4
    c.prepare_epoch()
    sampler.state = 9
    c.begin_epoch(iter(loader.batch_sampler), 1)
    assert c.record.sampler_states == {"sampler": {"state": 4}}
    assert c._sampler_states is None


def test_prepare_epoch_puts_a_pending_resumes_sampler_states_back():
    sampler = StatefulSampler()
    loader = _map(sampler=sampler)
    c, rec = _cursor(loader)
    states = {"sampler": {"state": 6}}
    rec.resume.pending = _pending(sampler_states=states)
    c.prepare_epoch()
    assert sampler.state == 6
    c.begin_epoch(iter(loader.batch_sampler), 1)
    assert c.record.sampler_states == states and c.record.sampler_states is not states


def test_an_epoch_without_prepare_has_no_sampler_states():
    loader = _map()
    c, _ = _cursor(loader)
    c.begin_epoch(iter(loader.batch_sampler), 1)
    assert c.record.sampler_states == {}


def test_begin_epoch_advances_the_epoch_and_records_what_regenerates_the_order():
    g = torch.Generator().manual_seed(3)
    ds = list(range(12))
    sampler = DistributedSampler(ds, num_replicas=2, rank=0)
    sampler.set_epoch(4)
    loader = DataLoader(ds, batch_size=2, sampler=sampler, generator=g, num_workers=3)
    c, rec = _cursor(loader)
    rec.epoch = 2
    start = _begin(c, loader, seed=77)
    assert isinstance(start, EpochStart)
    assert rec.epoch == 3 and c.record.epoch == 3 and c.record.base_seed == 77
    assert start.base_seed == 77 and start.stream_states == {} and start.first_worker is None
    assert start.discard == 0 and start.ended == frozenset()
    assert c.record.generators == (_order.rng_bytes(g.get_state()),)
    assert c.record.sampler_epoch == 4 and c.record.workers == 3
    assert rec.resume.current is c.record and not c.record.replay
    assert start.sampler_iter is c._stream and c._stream.record is c.record
    assert list(start.sampler_iter) == list(iter(loader.batch_sampler))


def test_persistent_workers_keep_their_states_into_the_next_epoch():
    loader = _map(num_workers=2, persistent_workers=True)
    c, rec = _cursor(loader)
    _begin(c, loader)
    c.record.streams.received = {0: {"dataset": 1, "position": 5}, 1: {"position": 3}}
    first = c.record
    _begin(c, loader)
    assert c.record is not first
    assert c.record.streams.received == {0: {"dataset": 1}}
    # an epoch that is not the next of the last one: nothing carried
    rec.epoch += 1
    c.record.streams.received = {0: {"dataset": 1}}
    _begin(c, loader)
    assert c.record.streams.received == {}


def test_num_workers_0_keeps_its_datasets_state_into_the_next_epoch():
    loader = _map()
    c, _ = _cursor(loader)
    _begin(c, loader)
    c.record.streams.received = {0: {"dataset": 2}}
    _begin(c, loader)
    assert c.record.streams.received == {0: {"dataset": 2}}


def test_new_workers_of_a_non_persistent_loader_start_afresh():
    loader = _map(num_workers=2)
    c, _ = _cursor(loader)
    _begin(c, loader)
    c.record.streams.received = {0: {"dataset": 2}}
    _begin(c, loader)
    assert c.record.streams.received == {}


def test_a_loaded_finished_epochs_states_go_on():
    loader = _map(num_workers=2, persistent_workers=True)
    c, rec = _cursor(loader)
    rec.resume.carry, rec.resume.carry_workers = {1: {"dataset": 7, "position": 2}}, 2
    rec.resume.next_rng, rec.resume.next_seed = b"r", 5
    start = _begin(c, loader)
    assert start.stream_states == {1: {"dataset": 7}}
    assert c.record.streams.received == {1: {"dataset": 7}}
    assert c.record.streams.received is not start.stream_states
    assert rec.resume.carry == {} and rec.resume.carry_workers is None
    assert rec.resume.next_rng is None and rec.resume.next_seed is None


def test_a_resumed_map_style_epoch_continues_where_it_was():
    loader = _map(num_workers=3)
    c, rec = _cursor(loader)
    torch.manual_seed(0)
    rng = _order.rng_bytes(torch.get_rng_state())
    rec.resume.pending = _pending(base_seed=5, position=2, delivered_after=(4,),
                                  batches_yielded=3, torch_rng=rng,
                                  worker_states=((0, {"rng": 1}), (2, {"ended": True})),
                                  last_worker=2, workers=3)
    start = _begin(c, loader, seed=99)
    r = c.record
    assert start.base_seed == 5 and r.base_seed == 5 and r.torch_rng == rng and r.replay
    assert (r.delivered.prefix, r.delivered.extra, r.delivered.yielded) == (2, {4}, 3)
    assert (r.skip_prefix, r.skip_extra) == (2, frozenset({4}))
    assert start.stream_states == {0: {"rng": 1}, 2: {"ended": True}}
    assert r.streams.received == start.stream_states and r.streams.last_worker == 2
    assert start.ended == frozenset({2})
    assert start.first_worker == 0  # after worker 2, round the 3
    assert not c.pending() and rec.resume.pending is None
    assert [b for b in start.sampler_iter] == [[4, 5], [6, 7], [10, 11]]


def test_the_first_worker_after_the_last_one():
    loader = _map(num_workers=3)
    c, rec = _cursor(loader)
    rec.resume.pending = _pending(worker_states=((0, {"rng": 1}),), last_worker=0, workers=3)
    assert _begin(c, loader).first_worker == 1
    c2, rec2 = _cursor(loader)
    rec2.resume.pending = _pending(worker_states=((0, {"rng": 1}),), last_worker=None, workers=3)
    assert _begin(c2, loader).first_worker is None
    c3, rec3 = _cursor(loader)
    rec3.resume.pending = _pending(worker_states=(), last_worker=1, workers=3)
    assert _begin(c3, loader).first_worker is None  # no states: round from worker 0
    zero = _map()
    c4, rec4 = _cursor(zero)
    rec4.resume.pending = _pending(worker_states=((0, {"rng": 1}),), last_worker=0, workers=0)
    assert _begin(c4, zero).first_worker is None


def test_a_resumed_stream_that_cannot_be_positioned_drops_what_was_received():
    loader = DataLoader(Stream(), batch_size=2, num_workers=2)
    c, rec = _cursor(loader)
    rec.resume.pending = _pending(position=3, batches_yielded=3, delivered_after=(),
                                  worker_states=((0, {"position": 2}),), workers=2,
                                  last_worker=1)
    start = _begin(c, loader)
    assert start.discard == 3 and start.stream_states == {} and start.first_worker is None
    r = c.record
    assert r.replay and r.delivered.prefix == 0 and r.delivered.yielded == 0
    assert r.skip_prefix == 0 and r.streams.last_worker is None


def test_a_resumed_stream_with_states_continues():
    loader = DataLoader(Stream(), batch_size=2, num_workers=2)
    c, rec = _cursor(loader)
    rec.resume.pending = _pending(position=3, batches_yielded=3,
                                  worker_states=((0, {"dataset": 1}),), workers=2,
                                  last_worker=0)
    start = _begin(c, loader)
    assert start.discard == 0 and start.stream_states == {0: {"dataset": 1}}
    assert start.first_worker == 1
    r = c.record
    assert r.delivered.prefix == 3 and r.delivered.extra == set() and r.skip_extra == frozenset()


def test_a_resume_whose_sampler_is_at_another_epoch_is_refused():
    ds = list(range(8))
    sampler = DistributedSampler(ds, num_replicas=2, rank=0)
    sampler.set_epoch(3)
    loader = DataLoader(ds, batch_size=2, sampler=sampler)
    c, rec = _cursor(loader)
    rec.resume.pending = _pending(sampler_epoch=2)
    with pytest.raises(StateMismatchError) as info:
        _begin(c, loader)
    assert str(info.value) == (
        "stoker: the checkpoint was saved in the middle of an epoch whose sampler had "
        "set_epoch(2), but the sampler is now at epoch 3: the rest of that epoch would come from "
        "another order. Call sampler.set_epoch(2) before iterating (or after load_state_dict, "
        "which sets it), as the saved run did.")


def test_a_resume_puts_the_generators_back():
    g = torch.Generator().manual_seed(1)
    saved = _order.rng_bytes(g.get_state())
    want = list(iter(DataLoader(list(range(12)), batch_size=2, shuffle=True,
                                generator=torch.Generator().manual_seed(1)).batch_sampler))
    torch.rand(5, generator=g)  # moved on
    loader = DataLoader(list(range(12)), batch_size=2, shuffle=True, generator=g)
    c, rec = _cursor(loader)
    rec.resume.pending = _pending(generators=(saved,))
    start = _begin(c, loader)
    assert c.record.generators == (saved,)
    assert list(start.sampler_iter) == want


def test_an_elastic_epoch_is_this_ranks_share_of_the_order():
    import numpy as np

    ds = list(range(12))
    sampler = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=False)
    loader = DataLoader(ds, batch_size=2, sampler=sampler)
    c, rec = _cursor(loader)
    order = np.array([9, 8, 7, 6, 5, 4], dtype=np.int64).tobytes()
    rec.resume.pending = _pending(order=order, sampler_epoch=0)
    start = _begin(c, loader)
    assert c.record.order == order
    assert list(start.sampler_iter) == [[8, 6], [4]]


# -- progress -----------------------------------------------------------------------------------------
def test_tasks_sent_and_delivered():
    loader = _map()
    c, rec = _cursor(loader)
    stream = _begin(c, loader).sampler_iter
    next(stream)
    c.sent(10)
    next(stream)
    c.sent(11)
    assert c.record.task_pos == {10: 0, 11: 1}
    c.delivered(11, worker=1)
    r = c.record
    assert r.delivered.extra == {1} and r.delivered.yielded == 1 and r.streams.last_worker == 1
    c.delivered(10, worker=0, outcome=False)  # a stream that had ended: no batch
    assert r.delivered.prefix == 2 and r.delivered.yielded == 1 and r.streams.last_worker == 1
    assert r.task_pos == {}
    c.delivered(10, worker=3)  # (already delivered: only the worker is noted)
    assert r.delivered.yielded == 1 and r.streams.last_worker == 3


def test_a_streams_state_goes_with_its_task():
    loader = DataLoader(Stream(), batch_size=2, num_workers=2)
    c, _ = _cursor(loader)
    _begin(c, loader)
    s = c.record.streams
    c.observe(StreamState(task=4, worker=1, state={"dataset": 1}))
    assert s.by_task == {4: (1, {"dataset": 1})}
    c.observe(BatchReady(task=4, worker=1, batch=None))
    assert s.arrived == {1: {"dataset": 1}} and s.arrived_from == {1}
    c.observe(BatchReady(task=5, worker=0, batch=None))  # no state sent with it
    assert s.arrived == {1: {"dataset": 1}} and s.arrived_from == {0, 1}
    c.observe(object())  # (neither)
    c.delivered(4, worker=1)
    assert s.received == {1: {"dataset": 1}} and s.by_task == {}
    c.delivered(5, worker=0)
    assert s.received == {1: {"dataset": 1}}


def test_a_task_that_will_never_have_an_outcome_counts_as_delivered():
    loader = _map()
    c, _ = _cursor(loader)
    stream = _begin(c, loader).sampler_iter
    next(stream)
    c.sent(1)
    c.observe(StreamState(task=1, worker=0, state={"d": 1}))
    c.passed(1)
    r = c.record
    assert r.delivered.prefix == 1 and r.delivered.yielded == 0 and r.task_pos == {}
    assert r.streams.by_task == {} and r.streams.last_worker is None
    c.passed(1)  # (unknown now: nothing)
    assert r.delivered.prefix == 1


def test_one_process_progress():
    loader = _map()
    c, _ = _cursor(loader)
    stream = _begin(c, loader).sampler_iter
    next(stream)
    next(stream)
    assert c.here() == 1
    c.delivered_here()
    r = c.record
    assert r.delivered.extra == {1} and r.delivered.yielded == 1 and r.streams.last_worker == 0
    c.delivered_here(0)
    assert r.delivered.prefix == 2 and r.delivered.yielded == 2
    c.stream_state_here(None)
    assert r.streams.received == {}
    c.stream_state_here({"dataset": 3})
    assert r.streams.received == {0: {"dataset": 3}}
    assert not r.delivered.finished
    c.finished()
    assert r.delivered.finished


# -- a worker's death ---------------------------------------------------------------------------------
def test_a_map_style_worker_can_always_restart():
    loader = _map(num_workers=2)
    c, _ = _cursor(loader)
    _begin(c, loader)
    assert c.restart_state(0) == (True, None)
    c.observe(StreamState(task=1, worker=0, state={"rng": 1}))
    c.observe(BatchReady(task=1, worker=0, batch=None))
    assert c.restart_state(0) == (True, {"rng": 1}) and c.can_restart_stream(0)


def test_a_stream_worker_restarts_only_from_a_known_position():
    loader = DataLoader(Stream(), batch_size=2, num_workers=2)
    c, _ = _cursor(loader)
    _begin(c, loader)
    assert c.restart_state(0) == (True, None)  # delivered nothing yet
    c.observe(BatchReady(task=1, worker=0, batch=None))
    assert c.restart_state(0) == (False, None) and not c.can_restart_stream(0)
    c.observe(StreamState(task=2, worker=1, state={"position": 3}))  # not a stream's state
    c.observe(BatchReady(task=2, worker=1, batch=None))
    assert c.restart_state(1) == (False, None)
    c.observe(StreamState(task=3, worker=1, state={"iterator": 3}))
    c.observe(BatchReady(task=3, worker=1, batch=None))
    assert c.restart_state(1) == (True, {"iterator": 3})


_WARNING = "stoker: this state was saved with num_workers="


def _warned(caplog):
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(_WARNING)]


def test_a_loaded_finished_states_other_workers_are_warned_of_as_the_epoch_begins(caplog):
    loader = _map(num_workers=2, persistent_workers=True)
    c, rec = _cursor(loader)
    rec.resume.carry, rec.resume.carry_workers = {0: {"dataset": 1}}, 3
    with caplog.at_level(logging.WARNING, logger="stoker"):
        assert c.starting_stream_states() == {}  # (workers starting: no warning yet)
        with c.drawing_base_seed():
            pass
        assert _warned(caplog) == []
        start = _begin(c, loader)
    assert start.stream_states == {}
    assert len(_warned(caplog)) == 1 and "num_workers=3 and is resumed with 2" in _warned(caplog)[0]


def test_num_workers_0_is_not_warned_twice(caplog):
    loader = _map()
    c, rec = _cursor(loader)
    rec.resume.carry, rec.resume.carry_workers = {0: {"dataset": 1}}, 2
    with caplog.at_level(logging.WARNING, logger="stoker"):
        with c.drawing_base_seed():  # (no warning here: the epoch's begin warns)
            pass
        assert _warned(caplog) == []
        _begin(c, loader)
    assert len(_warned(caplog)) == 1


def test_a_pending_states_other_workers_are_warned_of_as_the_epoch_begins(caplog):
    loader = _map(num_workers=2)
    c, rec = _cursor(loader)
    rec.resume.pending = _pending(worker_states=((0, {"rng": 1}),), workers=3)
    with caplog.at_level(logging.WARNING, logger="stoker"):
        assert c.starting_stream_states() == {}
        assert _warned(caplog) == []
        start = _begin(c, loader)
    assert start.stream_states == {} and len(_warned(caplog)) == 1


def test_states_saved_without_workers_but_not_worker_0s():
    loader = _map(num_workers=2)
    c, _ = _cursor(loader)
    assert c._usable({1: {"dataset": 1}}, 0, loader, warn=False) == {}


def test_a_worker_that_sent_no_state_can_restart():
    loader = _map(num_workers=2)
    c, _ = _cursor(loader)
    _begin(c, loader)
    assert c.can_restart_stream(0) is True
