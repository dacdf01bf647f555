"""The pure parts of resuming under another batch size (loader/resume/layout.py and
rebatch.py), in one process: which base positions a state's batches delivered, the layer that
takes them out, the batches of the rest, and the counts len(loader) and delivered_all give."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler

import stoker
from stoker.loader.resume import layout, rebatch
from stoker.loader.resume.state import State, fingerprint

pytestmark = pytest.mark.unit  # no process (tests/support/tiers.py)


def state(**kw):
    kw.setdefault("finished", False)
    kw.setdefault("epoch", 1)
    return State(loader={}, **kw)


def marked(mask):
    return np.flatnonzero(mask).tolist()


def test_the_positions_a_states_batches_delivered():
    # batches of 4 over 0..; 0 and 1 in order, 3 early (in_order=False)
    st = state(position=2, delivered_after=(3,))
    assert marked(layout.delivered_mask(st, 4, 50)) == [*range(8), *range(12, 16)]
    assert marked(layout.delivered_mask(st, 4, 14)) == [*range(8), 12, 13]  # a short last batch
    assert marked(layout.delivered_mask(st, None, 50)) == [0, 1, 3]  # batch_size=None: one each
    assert marked(layout.delivered_mask(state(), 4, 50)) == []
    finished = layout.delivered_mask(state(finished=True), 4, 6)
    assert layout.layer_of(finished) == {"prefix": 6, "also": ()}  # a boolean mask, all of it
    # batches delivered ahead, not the last of them: each is one batch's positions
    st = state(position=1, delivered_after=(2, 4))
    assert marked(layout.delivered_mask(st, 2, 20)) == [0, 1, 4, 5, 8, 9]
    # over the rest a layer leaves: [0, 3) and 5, 6 taken out; batches of 2 over 3, 4, 7, 8, ...
    layer = {"prefix": 3, "also": (5, 6)}
    st = state(position=2, delivered_after=(3,), rebatch=layer)
    assert marked(layout.delivered_mask(st, 2, 20)) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 11, 12]
    # an also beyond every delivered batch stays marked
    st = state(position=1, rebatch={"prefix": 0, "also": (9,)})
    assert marked(layout.delivered_mask(st, 2, 20)) == [0, 1, 9]
    # a position past the base sequence is not in it (the mask stops at its end)
    st = state(position=1, rebatch={"prefix": 0, "also": (5,)})
    assert marked(layout.delivered_mask(st, 2, 5)) == [0, 1]


def test_the_layer_of_a_mask():
    mask = np.array([1, 1, 1, 0, 1, 0, 0, 1], dtype=bool)
    assert layout.layer_of(mask) == {"prefix": 3, "also": (4, 7)}
    assert layout.layer_of(np.ones(4, dtype=bool)) == {"prefix": 4, "also": ()}
    assert layout.layer_of(np.zeros(0, dtype=bool), (5, 2)) == {"prefix": 0, "also": (2, 5)}
    assert layout.layer_of(np.array([1, 0], dtype=bool), (1, 6)) == {"prefix": 1, "also": (6,)}
    assert layout.layer_of(np.array([1, 0], dtype=bool), (2,)) == {"prefix": 1, "also": (2,)}
    assert layout.taken(None) == (0, ())
    assert layout.taken({"prefix": 2, "also": [5, 7]}) == (2, (5, 7))


def test_the_batches_of_the_rest():
    base = list(range(100, 111))  # 11 indices
    layer = {"prefix": 2, "also": (4, 5)}
    assert list(layout.batches(base, layer, 3, False)) == [
        [102, 103, 106], [107, 108, 109], [110]]
    assert list(layout.batches(base, layer, 3, True)) == [[102, 103, 106], [107, 108, 109]]
    assert list(layout.batches(base, None, 4, False)) == [base[:4], base[4:8], base[8:]]
    drawn = []

    def sampler():
        for i in base:
            drawn.append(i)
            yield i

    it = layout.batches(sampler(), layer, 5, True)
    assert drawn == []  # nothing drawn before the first batch is asked for
    assert list(it) == [[102, 103, 106, 107, 108]]
    assert drawn == base  # the whole base drawn (its generators end where a whole epoch's do)


def test_counts():
    assert layout.rest_length(11, {"prefix": 2, "also": (4, 5, 20)}) == 7
    assert layout.rest_length(3, {"prefix": 5, "also": ()}) == 0
    assert layout.rest_length(5, {"prefix": 1, "also": (3, 5)}) == 3  # 5 is past the end
    assert layout.rest_length(11, None) == 11
    assert layout.batch_count(7, 3, False) == 3
    assert layout.batch_count(7, 3, True) == 2
    assert layout.batch_count(6, 3, False) == layout.batch_count(6, 3, True) == 2
    assert layout.batch_count(7, None, True) == 7


def loader(b=8, n=50, **kw):
    return stoker.DataLoader(list(range(n)), batch_size=b, **kw)


def test_len_and_delivered_all_of_an_epochs_state():
    ld = loader(12)  # 50 samples: 5 batches of 12
    st = state(position=3, batches_yielded=3, rebatch={"prefix": 24, "also": ()})
    assert rebatch.epoch_batches(None, st.rebatch, ld, 12) == 3  # 26 left: 12, 12, 2
    assert rebatch.length(st.replace(position=0), ld) == 3 + 3
    assert rebatch.length(st.replace(position=1, batches_yielded=4), ld) == 4 + 2
    assert rebatch.length(st.replace(position=1, delivered_after=(2,), batches_yielded=5),
                          ld) == 5 + 1
    assert rebatch.length(state(position=2), ld) is None  # the loader's own batches
    assert rebatch.length(st.replace(finished=True), ld) is None
    assert rebatch.all_delivered(st, ld) is True  # position 3 of 3
    assert rebatch.all_delivered(st.replace(position=2), ld) is False
    assert rebatch.all_delivered(state(position=5), ld) is True  # torch's own count: 5
    assert rebatch.all_delivered(state(position=4), ld) is False
    assert rebatch.all_delivered(state(finished=True), ld) is True
    assert rebatch.epoch_batches(None, None, loader(12, drop_last=True), 8) == 6
    assert rebatch.epoch_batches(None, None, ld, 8) == 7


def test_len_of_an_elastic_share():
    ds = list(range(12))
    ld = stoker.DataLoader(ds, batch_size=2, sampler=DistributedSampler(
        ds, num_replicas=2, rank=1, shuffle=False))
    order = np.arange(10, dtype=np.int64).tobytes()  # this rank: 1, 3, 5, 7, 9
    st = state(order=order, batches_yielded=0)
    assert rebatch.base_length(order, ld) == 5
    assert rebatch.length(st, ld) == 3
    assert [b for b in rebatch.batches_of(ld, order, None)] == [[1, 3], [5, 7], [9]]
    assert list(rebatch.batches_of(ld, order, {"prefix": 1, "also": (3,)})) == [[3, 5], [9]]


def test_a_loaded_state_in_another_batch_size_is_converted_and_len_says_so():
    ld = loader(8)
    it = iter(ld)
    got = [next(it).tolist() for _ in range(3)]
    sd = ld.state_dict()
    other = loader(12)
    other.load_state_dict(sd)
    assert len(other) == 3 + 3  # 26 left: 12, 12, 2
    again = other.state_dict()
    assert (again["rebatch"], again["position"], again["batches_yielded"]) == (
        {"prefix": 24, "also": ()}, 0, 3)
    assert again["loader"]["batch_size"] == 12
    assert again["loader"]["batches_per_epoch"] == 5  # torch's own count, not len(loader)
    rest = [b.tolist() for b in other]
    assert sum(got + rest, []) == list(range(50))
    assert [len(b) for b in rest] == [12, 12, 2]
    assert len(other) == 5


def test_why_not_names_each_batching():
    ld, none = loader(8), loader(None)
    st = State(loader=fingerprint(ld), epoch=1, finished=False, position=2, batches_yielded=2)
    assert rebatch.why_not(st, fingerprint(loader(5))) is None
    assert rebatch.why_not(st, fingerprint(ld)) is None
    assert "this one has batch_size=None (each item" in rebatch.why_not(st, fingerprint(none))
    bad = st.replace(loader=dict(st.loader, batch_size=True))
    assert "not a batch size" in rebatch.why_not(bad, fingerprint(ld))
    assert rebatch.as_saved(st, fingerprint(loader(5)), loader(5), None) == fingerprint(ld)
    assert rebatch.as_saved(st, fingerprint(ld), ld, None) is None


def test_an_old_state_says_whether_it_had_delivered_every_batch():
    ld = loader(10)
    for _ in ld:
        sd = ld.state_dict()
    old = {k: v for k, v in sd.items() if k not in ("rebatch", "delivered_all")}
    assert State.from_dict(dict(old, version=3)).delivered_all is True
    assert State.from_dict(dict(old, version=3, position=4)).delivered_all is False
    assert State.from_dict(dict(old, version=3, finished=True, position=0)).delivered_all is True
    elastic = dict(old, version=3, order="")  # an elastic epoch: its count is not the loader's
    assert State.from_dict(elastic).delivered_all is None
    streamed = dict(old, version=3, loader=dict(sd["loader"], batches_per_epoch=None))
    assert State.from_dict(streamed).delivered_all is None


def test_the_fingerprint_counts_torchs_batches_not_a_resumed_epochs():
    ld = loader(8)
    assert fingerprint(ld)["batches_per_epoch"] == torch.utils.data.DataLoader.__len__(ld) == 7
