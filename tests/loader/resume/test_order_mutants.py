"""stoker.loader.resume.order: what regenerates an epoch's order (generators, the sampler's epoch,
stateful samplers), read from and put back into a loader."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, RandomSampler

from stoker.loader.resume import order

pytestmark = pytest.mark.unit  # no process (tests/support/tiers.py)


def test_rng_state_as_bytes_and_back():
    g = torch.Generator().manual_seed(4)
    state = g.get_state()
    b = order.rng_bytes(state)
    assert isinstance(b, bytes) and b == bytes(state.tolist())
    t = order.rng_tensor(b)
    assert t.dtype == torch.uint8 and torch.equal(t, state)
    t[0] = 255 - t[0]  # (writable, its own buffer: the bytes are unchanged)
    assert b == bytes(state.tolist())


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def test_the_generators_of_a_loader_in_order_once_each():
    g_loader, g_sampler, g_bs = _gen(1), _gen(2), _gen(3)
    sampler = SimpleNamespace(generator=g_sampler)
    inner = SimpleNamespace(generator=g_sampler)  # the same one twice: once
    bs = SimpleNamespace(generator=g_bs, sampler=inner)
    loader = SimpleNamespace(generator=g_loader, sampler=sampler, batch_sampler=bs)
    assert order.generators(loader) == [("generator", g_loader), ("sampler", g_sampler),
                                        ("batch_sampler", g_bs)]
    other = _gen(4)
    bs.sampler = SimpleNamespace(generator=other)
    assert order.generators(loader)[-1] == ("batch_sampler.sampler", other)


def test_what_is_not_a_generator_is_passed_over():
    loader = SimpleNamespace(generator=5, sampler=None, batch_sampler=SimpleNamespace())
    assert order.generators(loader) == []
    g = _gen(1)
    loader = SimpleNamespace(generator=None, sampler=SimpleNamespace(),
                             batch_sampler=SimpleNamespace(sampler=SimpleNamespace(generator=g)))
    assert order.generators(loader) == [("batch_sampler.sampler", g)]


def test_a_torch_loader_generators():
    g = _gen(7)
    loader = DataLoader(list(range(10)), batch_size=2, shuffle=True, generator=g)
    # the loader's and its RandomSampler's are one
    assert order.generators(loader) == [("generator", g)]


def test_generators_captured_and_put_back():
    g1, g2 = _gen(1), _gen(2)
    loader = SimpleNamespace(generator=g1, sampler=SimpleNamespace(generator=g2),
                             batch_sampler=None)
    states = order.capture_generators(loader)
    assert states == (order.rng_bytes(g1.get_state()), order.rng_bytes(g2.get_state()))
    want = (torch.rand(3, generator=g1), torch.rand(3, generator=g2))
    order.set_generators(loader, states)
    assert torch.equal(torch.rand(3, generator=g1), want[0])
    assert torch.equal(torch.rand(3, generator=g2), want[1])
    order.set_generators(loader, ())  # (nothing to put back)
    assert order.capture_generators(SimpleNamespace(generator=None, sampler=None,
                                                    batch_sampler=None)) == ()


class _Epoch:
    def __init__(self, epoch=0, **kw):
        self.epoch = epoch
        self.__dict__.update(kw)

    def set_epoch(self, e):
        self.epoch = e


def test_the_epoch_sampler_is_the_innermost_with_set_epoch():
    inner, outer, main = _Epoch(1), _Epoch(2), _Epoch(3)
    loader = SimpleNamespace(sampler=main, batch_sampler=SimpleNamespace(sampler=inner))
    assert order.epoch_sampler(loader) is inner and order.sampler_epoch(loader) == 1
    loader.batch_sampler = outer
    outer.sampler = SimpleNamespace()
    assert order.epoch_sampler(loader) is outer and order.sampler_epoch(loader) == 2
    loader.batch_sampler = SimpleNamespace(sampler=None)
    assert order.epoch_sampler(loader) is main and order.sampler_epoch(loader) == 3
    loader.sampler = SimpleNamespace()
    assert order.epoch_sampler(loader) is None and order.sampler_epoch(loader) is None
    loader.sampler = None
    loader.batch_sampler = None
    assert order.epoch_sampler(loader) is None


def test_a_sampler_with_set_epoch_but_no_epoch():
    class NoEpoch:
        def set_epoch(self, e):
            pass

    loader = SimpleNamespace(sampler=NoEpoch(), batch_sampler=None)
    assert order.sampler_epoch(loader) is None


def test_a_distributed_samplers_epoch():
    ds = list(range(8))
    s = DistributedSampler(ds, num_replicas=2, rank=0)
    s.set_epoch(5)
    loader = DataLoader(ds, batch_size=2, sampler=s)
    assert order.sampler_epoch(loader) == 5


class _Stateful:
    def __init__(self, n=0, sampler=None):
        self.n = n
        if sampler is not None:
            self.sampler = sampler

    def state_dict(self):
        return {"n": self.n}

    def load_state_dict(self, sd):
        self.n = sd["n"]

    def __iter__(self):
        return iter(())


def test_samplers_once_each_in_order():
    a, b, c = _Stateful(1), _Stateful(2), _Stateful(3)
    loader = SimpleNamespace(sampler=a, batch_sampler=_Stateful(2, sampler=c))
    loader.batch_sampler = b
    b.sampler = c
    assert order._samplers(loader) == [("sampler", a), ("batch_sampler", b),
                                       ("batch_sampler.sampler", c)]
    b.sampler = a  # the same as loader.sampler: once
    assert order._samplers(loader) == [("sampler", a), ("batch_sampler", b)]
    loader.batch_sampler = None
    assert order._samplers(loader) == [("sampler", a)]
    loader.sampler = None
    assert order._samplers(loader) == []


def test_stateful_samplers_states_captured_and_put_back():
    a, c = _Stateful(1), _Stateful(3)
    plain = SimpleNamespace(sampler=c)  # a batch sampler without a state of its own
    loader = SimpleNamespace(sampler=a, batch_sampler=plain)
    assert order.stateful_samplers(loader) == [("sampler", a), ("batch_sampler.sampler", c)]
    states = order.capture_sampler_states(loader)
    assert states == {"sampler": {"n": 1}, "batch_sampler.sampler": {"n": 3}}
    a.n, c.n = 10, 30
    order.set_sampler_states(loader, {"sampler": {"n": 5}})  # only what is given
    assert (a.n, c.n) == (5, 30)
    order.set_sampler_states(loader, states)
    assert (a.n, c.n) == (1, 3)


def test_a_samplers_state_that_is_no_plain_data_is_named():
    class Bad(_Stateful):
        def state_dict(self):
            return {"x": object()}

    loader = SimpleNamespace(sampler=Bad(), batch_sampler=None)
    with pytest.raises(TypeError, match=r"the sampler's state_dict\(\)"):
        order.capture_sampler_states(loader)


def test_a_torch_loader_has_no_stateful_sampler():
    loader = DataLoader(list(range(10)), batch_size=2, shuffle=True)
    assert order.stateful_samplers(loader) == []
    assert order.capture_sampler_states(loader) == {}
    bs = BatchSampler(RandomSampler(range(10)), 2, False)
    loader = DataLoader(list(range(10)), batch_sampler=bs)
    assert [p for p, _ in order._samplers(loader)] == ["sampler", "batch_sampler",
                                                      "batch_sampler.sampler"]
