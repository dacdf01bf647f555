"""stoker.loader.resume.validate: every field of a loaded state checked, each refusal naming the field,
what it holds and what was expected."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

from stoker import StateMismatchError
from stoker.common import rng_state
from stoker.loader.resume import validate
from stoker.loader.resume.state import State

pytestmark = pytest.mark.unit  # no process (tests/support/tiers.py)

RNG = len(torch.get_rng_state())
BASE = State(loader={})


def _msg(name, value, expected) -> str:
    r = repr(value)
    r = r if len(r) <= 120 else r[:117] + "..."
    return (f"stoker: this state's {name} is {r} ({type(value).__name__}); expected "
            f"{expected}. The checkpoint was edited, truncated or made by another tool: nothing "
            "was loaded (the loader is as it was). Use a state from loader.state_dict(), or start "
            "afresh without load_state_dict.")


def _refused(check, st, name, value, expected):
    with pytest.raises(StateMismatchError) as info:
        check(st)
    assert str(info.value) == _msg(name, value, expected)


def _fields(**kw) -> State:
    return dataclasses.replace(BASE, **kw)


def test_a_default_state_passes():
    validate.check_fields(BASE)
    validate.check_fields(_fields(epoch=1, finished=False))


_CASES = [
    # (fields, name, the value named, expected)
    ({"loader": []}, "loader", [], "the saved loader's fingerprint (a dict)"),
    ({"finished": 1}, "finished", 1, "True or False"),
    ({"epoch": -1}, "epoch", -1, "an int >= 1 (>= 0 for a finished epoch)"),
    ({"epoch": 0, "finished": False}, "epoch", 0, "an int >= 1 (>= 0 for a finished epoch)"),
    ({"epoch": True}, "epoch", True, "an int >= 1 (>= 0 for a finished epoch)"),
    ({"epoch": 1.0}, "epoch", 1.0, "an int >= 1 (>= 0 for a finished epoch)"),
    ({"position": -1}, "position", -1, "an int >= 0"),
    ({"position": "0"}, "position", "0", "an int >= 0"),
    ({"delivered_after": {3}}, "delivered_after", {3}, "distinct int positions beyond position"),
    ({"delivered_after": (3, "4")}, "delivered_after", (3, "4"),
     "distinct int positions beyond position"),
    ({"delivered_after": (3, 3)}, "delivered_after", (3, 3),
     "distinct int positions beyond position"),
    ({"position": 3, "delivered_after": (3,)}, "delivered_after", (3,),
     "distinct int positions beyond position"),
    ({"position": 3, "delivered_after": (5, 2)}, "delivered_after", (5, 2),
     "distinct int positions beyond position"),
    ({"batches_yielded": -1}, "batches_yielded", -1, "an int >= 0"),
    ({"batches_yielded": None}, "batches_yielded", None, "an int >= 0"),
    ({"base_seed": 2**63}, "base_seed", 2**63, "an int64"),
    ({"base_seed": -(2**63) - 1}, "base_seed", -(2**63) - 1, "an int64"),
    ({"base_seed": "1"}, "base_seed", "1", "an int64"),
    ({"torch_rng": b"x"}, "torch_rng", b"x", f"None or torch's RNG state ({RNG} bytes)"),
    ({"torch_rng": "x" * RNG}, "torch_rng", "x" * RNG,
     f"None or torch's RNG state ({RNG} bytes)"),
    ({"generators": [b"a", "b"]}, "generators", [b"a", "b"], "a tuple of generator states (bytes)"),
    ({"generators": b"ab"}, "generators", b"ab", "a tuple of generator states (bytes)"),
    ({"generators_now": ("a",)}, "generators_now", ("a",), "a tuple of generator states (bytes)"),
    ({"sampler_epoch": -1}, "sampler_epoch", -1, "None or an int >= 0"),
    ({"sampler_epoch": "1"}, "sampler_epoch", "1", "None or an int >= 0"),
    ({"seed": "per_worker"}, "seed", "per_worker", "None or 'per_sample'"),
    ({"skipped": [(1, "r")]}, "skipped", [(1, "r")], "(index, reason, epoch) triples of plain data"),
    ({"skipped": (1,)}, "skipped", (1,), "(index, reason, epoch) triples of plain data"),
    ({"skipped": ((object, "r", 1),)}, "skipped", ((object, "r", 1),),
     "(index, reason, epoch) triples of plain data"),
    ({"skipped": ((1, 2, 1),)}, "skipped", ((1, 2, 1),),
     "(index, reason, epoch) triples of plain data"),
    ({"skipped": ((1, "r", "1"),)}, "skipped", ((1, "r", "1"),),
     "(index, reason, epoch) triples of plain data"),
    ({"skipped": ((1, "r", -1),)}, "skipped", ((1, "r", -1),),
     "(index, reason, epoch) triples of plain data"),
    ({"skipped": {}}, "skipped", {}, "(index, reason, epoch) triples of plain data"),
    ({"quarantined": ([1],)}, "quarantined", ([1],), "a tuple of plain dataset indices"),
    ({"quarantined": (object,)}, "quarantined", (object,), "a tuple of plain dataset indices"),
    ({"quarantined": "ab"}, "quarantined", "ab", "a tuple of plain dataset indices"),
    ({"order": b"1234567"}, "order", b"1234567", "None or an int64 order (bytes, 8 per sample)"),
    ({"order": [1]}, "order", [1], "None or an int64 order (bytes, 8 per sample)"),
    ({"worker_states": ((0,),)}, "worker_states", ((0,),),
     "(worker id, plain state) pairs, one per worker"),
    ({"worker_states": ((-1, 1),)}, "worker_states", ((-1, 1),),
     "(worker id, plain state) pairs, one per worker"),
    ({"worker_states": (("0", 1),)}, "worker_states", (("0", 1),),
     "(worker id, plain state) pairs, one per worker"),
    ({"worker_states": ((0, object),)}, "worker_states", ((0, object),),
     "(worker id, plain state) pairs, one per worker"),
    ({"worker_states": ((0, 1), (0, 2))}, "worker_states", ((0, 1), (0, 2)),
     "(worker id, plain state) pairs, one per worker"),
    ({"worker_states": {0: 1}}, "worker_states", {0: 1},
     "(worker id, plain state) pairs, one per worker"),
    ({"worker_states": (0,)}, "worker_states", (0,),
     "(worker id, plain state) pairs, one per worker"),
    ({"last_worker": -1}, "last_worker", -1, "None or a worker id"),
    ({"last_worker": "0"}, "last_worker", "0", "None or a worker id"),
    ({"workers": -1}, "workers", -1, "None or the num_workers the states were taken with"),
    ({"workers": 1.0}, "workers", 1.0, "None or the num_workers the states were taken with"),
    ({"next_torch_rng": b"x"}, "next_torch_rng", b"x",
     f"None or torch's RNG state ({RNG} bytes)"),
    ({"next_torch_rng": "x"}, "next_torch_rng", "x", f"None or torch's RNG state ({RNG} bytes)"),
    ({"next_base_seed": 2**63}, "next_base_seed", 2**63, "None or an int64"),
    ({"next_base_seed": -(2**63) - 1}, "next_base_seed", -(2**63) - 1, "None or an int64"),
    ({"next_base_seed": "1"}, "next_base_seed", "1", "None or an int64"),
    ({"sampler_states": []}, "sampler_states", [], "a dict of samplers' states (plain data)"),
    ({"sampler_states": {1: {}}}, "sampler_states", {1: {}},
     "a dict of samplers' states (plain data)"),
    ({"sampler_states": {"s": object}}, "sampler_states", {"s": object},
     "a dict of samplers' states (plain data)"),
    ({"sampler_states_now": {1: {}}}, "sampler_states_now", {1: {}},
     "a dict of samplers' states (plain data)"),
]


@pytest.mark.parametrize("fields,name,value,expected", _CASES,
                         ids=[f"{c[1]}-{i}" for i, c in enumerate(_CASES)])
def test_a_field_out_of_its_range_is_refused_by_name(fields, name, value, expected):
    _refused(validate.check_fields, _fields(**fields), name, value, expected)


_GOOD = [
    {"epoch": 0},
    {"epoch": 1, "finished": False},
    {"position": 0, "delivered_after": (1, 5)},
    {"position": 2, "delivered_after": [3]},
    {"batches_yielded": 0},
    {"base_seed": 2**63 - 1},
    {"base_seed": -(2**63)},
    {"torch_rng": b"x" * RNG, "next_torch_rng": b"y" * RNG},
    {"generators": [b"a", b"b"], "generators_now": (b"c",)},
    {"sampler_epoch": 0},
    {"seed": "per_sample"},
    {"skipped": [(1, "r", 0), ["k", "", 3]]},
    {"quarantined": [1, "a", (2, 3)]},
    {"order": b"12345678" * 2},
    {"order": b""},
    {"worker_states": [(0, {"x": 1}), [1, None]]},
    {"last_worker": 0, "workers": 0},
    {"next_base_seed": 2**63 - 1},
    {"next_base_seed": -(2**63)},
    {"sampler_states": {"s": {"a": [1]}}, "sampler_states_now": {}},
]


@pytest.mark.parametrize("fields", _GOOD)
def test_a_field_at_the_edge_of_its_range_passes(fields):
    validate.check_fields(_fields(**fields))


def _distributed(**kw):
    d = {"rank": 0, "num_replicas": 2, "seed": 0, "shuffle": True, "drop_last": False}
    d.update(kw)
    return d


@pytest.mark.parametrize("d", [
    [],
    {"rank": 0},
    {**_distributed(), "extra": 1},
    _distributed(num_replicas=0, rank=0),
    _distributed(num_replicas="2"),
    _distributed(rank=2),
    _distributed(rank=-1),
    _distributed(rank="0"),
    _distributed(seed="0"),
    _distributed(shuffle=1),
    _distributed(drop_last=None),
])
def test_a_distributed_samplers_fields(d):
    _refused(validate.check_fields, _fields(distributed=d), "distributed", d,
             "None or {rank, num_replicas, seed, shuffle, drop_last} of a DistributedSampler")


def test_a_distributed_sampler_that_fits():
    validate.check_fields(_fields(distributed=_distributed()))
    validate.check_fields(_fields(distributed=_distributed(rank=1)))
    validate.check_fields(_fields(distributed=_distributed(num_replicas=1)))
    validate.check_fields(_fields(distributed=None))


def test_a_workers_stream_state():
    ok = {"dataset": 1, "position": 0, "ended": True}
    validate.check_fields(_fields(worker_states=((2, ok),)))
    validate.check_fields(_fields(worker_states=((2, {"position": 5}),)))
    validate.check_fields(_fields(worker_states=((2, {"ended": False}),)))
    # another plain value, or a dict with keys of its own: the dataset's (stoker 0.1), as it is
    validate.check_fields(_fields(worker_states=((0, {"position": -1, "mine": 1}),)))
    validate.check_fields(_fields(worker_states=((0, 5),)))
    for bad, expected in (({"position": -1}, "a stream position (an int >= 0)"),
                          ({"position": "1"}, "a stream position (an int >= 0)"),
                          ({"position": True}, "a stream position (an int >= 0)"),
                          ({"ended": "yes"}, "'ended' True or False"),
                          ({"ended": None}, "'ended' True or False")):
        _refused(validate.check_fields, _fields(worker_states=((3, bad),)),
                 "worker_states (worker 3)", bad, expected)


def test_a_workers_generators():
    good = rng_state.plain(rng_state.Tracker().capture())
    validate.check_fields(_fields(worker_states=((0, {"rng": good}),)))
    validate.check_fields(_fields(worker_states=((0, {"rng": None}),)))
    bad = {"nope": 1}
    why = rng_state.problem(bad)
    assert why
    _refused(validate.check_fields, _fields(worker_states=((1, {"rng": bad}),)),
             "worker_states (worker 1)", bad, f"the worker's random generators: {why}")


def test_short_reprs():
    assert validate._short([1, 2]) == "[1, 2]"
    long = "x" * 200
    assert validate._short(long) == repr(long)[:117] + "..."
    assert len(validate._short(long)) == 120
    s = "y" * 118  # repr: 120
    assert validate._short(s) == repr(s)
    assert validate._short("abcdef", limit=5) == "'a..."

    class NoRepr:
        def __repr__(self):
            raise ValueError("no")

    assert validate._short(NoRepr()) == "<NoRepr>"


def test_a_long_value_is_named_short():
    long = "z" * 300
    with pytest.raises(StateMismatchError) as info:
        validate.check_fields(_fields(seed=long))
    assert str(info.value).startswith(
        f"stoker: this state's seed is {repr(long)[:117]}... (str); expected None or "
        "'per_sample'.")


def test_helpers():
    assert validate._int(3) and validate._int(-1) and not validate._int(True)
    assert not validate._int(1.0) and not validate._int("1")
    assert validate._seq(()) and validate._seq([]) and not validate._seq({}) and not validate._seq("")
    assert validate._hashable((1,)) and not validate._hashable([1]) and not validate._hashable({})
    validate._expect(True, "x", 1, "y")
    with pytest.raises(StateMismatchError, match="^stoker: this state's x is 1 \\(int\\); "
                                                 "expected y\\. "):
        validate._expect(False, "x", 1, "y")


# -- against a loader ---------------------------------------------------------------------------
def _loader(n=10, **kw):
    kw.setdefault("batch_size", 2)
    return DataLoader(list(range(n)), **kw)


class _Stream(IterableDataset):
    def __iter__(self):
        return iter(range(6))


def _against(loader, **kw):
    validate.check_against(_fields(**kw), loader)


def test_generators_fit_the_loaders():
    g = torch.Generator().manual_seed(0)
    loader = _loader(shuffle=True, generator=g)
    size = len(g.get_state())
    ok = (b"g" * size,)
    _against(loader, generators=ok, generators_now=ok, finished=False, epoch=1)
    _against(loader, generators=(), generators_now=ok)  # finished: only _now is checked
    for bad in ((), (b"g" * (size - 1),), ok * 2):
        with pytest.raises(StateMismatchError) as info:
            _against(loader, generators=bad, generators_now=ok, finished=False, epoch=1)
        assert str(info.value) == _msg(
            "generators", bad, f"the states of this loader's 1 generator(s) ([{size}] bytes)")
        with pytest.raises(StateMismatchError) as info:
            _against(loader, generators_now=bad)
        assert str(info.value) == _msg(
            "generators_now", bad, f"the states of this loader's 1 generator(s) ([{size}] bytes)")
    plain = _loader()
    _against(plain)
    with pytest.raises(StateMismatchError) as info:
        _against(plain, generators_now=ok)
    assert str(info.value) == _msg("generators_now", ok,
                                   "the states of this loader's 0 generator(s) ([] bytes)")


def test_the_sampler_epoch_is_there_when_the_sampler_has_one():
    ds = list(range(8))
    dist = _loader(sampler=DistributedSampler(ds, num_replicas=2, rank=0))
    _against(dist, finished=False, epoch=1, sampler_epoch=0)
    _against(dist, sampler_epoch=None)  # finished: not checked
    with pytest.raises(StateMismatchError) as info:
        _against(dist, finished=False, epoch=1, sampler_epoch=None)
    assert str(info.value) == _msg("sampler_epoch", None,
                                   "an int (this loader's sampler has set_epoch)")
    with pytest.raises(StateMismatchError) as info:
        _against(_loader(), finished=False, epoch=1, sampler_epoch=3)
    assert str(info.value) == _msg("sampler_epoch", 3,
                                   "None (this loader's sampler has no set_epoch)")
    _against(_loader(), sampler_epoch=3)  # finished


class _StatefulSampler:
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self):
        return self.n

    def state_dict(self):
        return {}

    def load_state_dict(self, sd):
        pass


def test_sampler_states_are_of_this_loaders_stateful_samplers():
    loader = _loader(sampler=_StatefulSampler(10))
    _against(loader, sampler_states={"sampler": {}}, sampler_states_now={"sampler": {}},
             finished=False, epoch=1)
    _against(loader)  # finished: none needed
    for name in ("sampler_states", "sampler_states_now"):
        bad = {"other": {}}
        with pytest.raises(StateMismatchError) as info:
            _against(loader, **{name: bad})
        assert str(info.value) == _msg(name, bad,
                                       "states of this loader's stateful samplers (['sampler'])")
    with pytest.raises(StateMismatchError) as info:
        _against(_loader(), sampler_states_now={"sampler": {}})
    assert str(info.value) == _msg("sampler_states_now", {"sampler": {}},
                                   "states of this loader's stateful samplers (none)")
    with pytest.raises(StateMismatchError) as info:
        _against(loader, finished=False, epoch=1)
    assert str(info.value) == _msg(
        "sampler_states", {}, "the state of each of this loader's stateful samplers "
        "(['sampler']) as the saved epoch began")


def test_an_iterable_datasets_workers():
    loader = DataLoader(_Stream(), batch_size=2, num_workers=2)
    _against(loader, worker_states=((0, 1), (1, 2)), last_worker=1)
    with pytest.raises(StateMismatchError) as info:
        _against(loader, worker_states=((2, 1),))
    assert str(info.value) == _msg("worker_states", ((2, 1),), "states of workers 0..1")
    with pytest.raises(StateMismatchError) as info:
        _against(loader, last_worker=2)
    assert str(info.value) == _msg("last_worker", 2, "None or a worker id below 2")
    one = DataLoader(_Stream(), batch_size=2)  # num_workers=0: one stream, worker 0
    _against(one, worker_states=((0, 1),), last_worker=0)
    with pytest.raises(StateMismatchError) as info:
        _against(one, worker_states=((1, 1),))
    assert str(info.value) == _msg("worker_states", ((1, 1),), "states of workers 0..0")
    with pytest.raises(StateMismatchError) as info:
        _against(one, last_worker=1)
    assert str(info.value) == _msg("last_worker", 1, "None or a worker id below 1")


def test_a_map_style_datasets_workers_are_those_saved():
    loader = _loader()
    _against(loader, worker_states=((0, 1), (2, 1)), workers=3, last_worker=2)
    _against(loader, worker_states=((0, 1),), workers=0, last_worker=0)
    with pytest.raises(StateMismatchError) as info:
        _against(loader, worker_states=((3, 1),), workers=3)
    assert str(info.value) == _msg("worker_states", ((3, 1),),
                                   "states of workers 0..2 (workers: 3)")
    with pytest.raises(StateMismatchError) as info:
        _against(loader, worker_states=((1, 1),), workers=0)
    assert str(info.value) == _msg("worker_states", ((1, 1),),
                                   "states of workers 0..0 (workers: 0)")
    with pytest.raises(StateMismatchError) as info:
        _against(loader, worker_states=((0, 1),))
    assert str(info.value) == _msg("worker_states", ((0, 1),),
                                   "nothing (no num_workers saved with them)")
    _against(loader, last_worker=0)  # (no workers saved: worker 0 at most)
    with pytest.raises(StateMismatchError) as info:
        _against(loader, last_worker=1)
    assert str(info.value) == _msg("last_worker", 1, "None or a worker id below 1")
    with pytest.raises(StateMismatchError) as info:
        _against(loader, last_worker=3, workers=3)
    assert str(info.value) == _msg("last_worker", 3, "None or a worker id below 3")


def _order(*ix):
    return np.array(ix, dtype=np.int64).tobytes()


def test_an_explicit_order_needs_a_distributed_sampler_and_indices_in_the_dataset():
    ds = list(range(8))
    dist = _loader(n=8, sampler=DistributedSampler(ds, num_replicas=2, rank=0, shuffle=False))
    _against(dist, order=_order(0, 7, 3, 4))
    _against(dist, order=_order())
    for bad in (_order(0, 8), _order(-1, 2)):
        with pytest.raises(StateMismatchError) as info:
            _against(dist, order=bad)
        assert str(info.value) == _msg("order", bad, "dataset indices in [0, 8)")
    with pytest.raises(StateMismatchError) as info:
        _against(_loader(n=8), order=_order(1, 2))
    assert str(info.value) == _msg(
        "order", _order(1, 2),
        "None (an explicit order needs this loader's sampler to be a DistributedSampler)")


def test_a_position_within_the_epochs_batches():
    loader = _loader(n=10)  # 5 batches
    mid = {"finished": False, "epoch": 1}
    _against(loader, position=5, **mid)
    _against(loader, position=2, delivered_after=(4,), **mid)
    with pytest.raises(StateMismatchError) as info:
        _against(loader, position=6, **mid)
    assert str(info.value) == _msg("position", 6, "at most the 5 batches of the saved epoch")
    with pytest.raises(StateMismatchError) as info:
        _against(loader, position=2, delivered_after=(3, 5), **mid)
    assert str(info.value) == _msg("delivered_after", (3, 5),
                                   "positions below the epoch's 5 batches")
    _against(loader, position=9)  # finished: not checked
    stream = DataLoader(_Stream(), batch_size=2)
    _against(stream, position=99, **mid)  # a stream: no length


def test_the_batches_of_an_elastic_epoch_are_this_ranks_share():
    ds = list(range(12))
    dist = _loader(n=12, sampler=DistributedSampler(ds, num_replicas=2, rank=1, shuffle=False))
    order = _order(*range(10))  # 5 each: 3 batches of 2
    st = _fields(order=order, finished=False, epoch=1, sampler_epoch=0)
    assert validate._batches_in_epoch(st, dist) == 3
    validate.check_against(dataclasses.replace(st, position=3), dist)
    with pytest.raises(StateMismatchError) as info:
        validate.check_against(dataclasses.replace(st, position=4), dist)
    assert str(info.value) == _msg("position", 4, "at most the 3 batches of the saved epoch")
    assert validate._batches_in_epoch(_fields(), dist) == len(dist) == 3
    assert validate._batches_in_epoch(_fields(), DataLoader(_Stream(), batch_size=2)) is None


def test_a_workers_state_with_every_key_is_checked():
    every = {"dataset": 1, "iterator": 2, "self": 3, "position": -1, "rng": None, "ended": False}
    _refused(validate.check_fields, _fields(worker_states=((0, every),)),
             "worker_states (worker 0)", every, "a stream position (an int >= 0)")
