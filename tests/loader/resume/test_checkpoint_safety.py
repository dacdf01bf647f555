"""A checkpoint is data, never code, and a state that is wrong is refused, never silently
resumed (issue 16): what state_dict() holds, what load_state_dict() accepts, and a fuzz of real
states with every field dropped, retyped, negated or enlarged."""

from __future__ import annotations

import base64
import io
import os
import pickle

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DistributedSampler

import stoker
from resume_datasets import (
    Augmented,
    FailsAt,
    NumpyPermSampler,
    OpaqueStateStream,
    StatefulStream,
    Stream,
    as_lists,
)
from stoker import StateMismatchError
from stoker.loader.resume.state import State
from stoker.loader.resume.state import digest as state_digest

PLAIN = (type(None), bool, int, float, str, bytes)


def _walk(value, path="state"):
    """Every (path, value) of a state that is not a container."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _walk(v, f"{path}[{k!r}]")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _walk(v, f"{path}[{i}]")
    else:
        yield path, value


def _assert_plain(sd):
    for path, v in _walk(sd):
        assert type(v) in PLAIN or type(v) is torch.Tensor, (path, type(v))
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    assert torch.load(buf, weights_only=True) is not None


def _rows(batches):
    return [b.tolist() if isinstance(b, torch.Tensor) else
            [t.tolist() for t in b] if isinstance(b, (list, tuple)) else as_lists([b])
            for b in batches]


# -- the loaders whose states are checked and fuzzed (num_workers=0: in this process) --------
def _map(**kw):
    return stoker.DataLoader(Augmented(40), batch_size=4, shuffle=True, seed="per_sample",
                             generator=torch.Generator().manual_seed(1), **kw)


def _skipping(**kw):
    return stoker.DataLoader(FailsAt({3, 9, 17, 30}, 40), batch_size=4, shuffle=True,
                             generator=torch.Generator().manual_seed(2), on_error="skip", **kw)


def _stateful_stream(**kw):
    return stoker.DataLoader(StatefulStream(40), batch_size=3, collate_fn=_without_reads, **kw)


def _without_reads(rows):
    """StatefulStream's rows are [worker, item, reads]; `reads` starts again at 1 in a restored
    stream (it tells a restore from a replay), so the comparison leaves it out."""
    return torch.utils.data.default_collate([r[:2] for r in rows])


def _stream(**kw):
    return stoker.DataLoader(Stream(30), batch_size=4, **kw)


def _ranked(**kw):
    ds = Augmented(30)
    s = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=3)
    return stoker.DataLoader(ds, batch_size=2, sampler=s, seed="per_sample",
                             generator=torch.Generator().manual_seed(6), **kw)


def _own_sampler(**kw):
    return stoker.DataLoader(Augmented(24), batch_size=4, seed="per_sample",
                             sampler=NumpyPermSampler(24, seed=7),
                             generator=torch.Generator().manual_seed(5), **kw)


def _rebatched(**kw):
    """A map-style loader of batches of 3 that resumed a state saved with batches of 4: its
    epoch's state has a layer (``rebatch``)."""
    first = _map()
    it = iter(first)
    for _ in range(3):
        next(it)
    sd = first.state_dict()
    del it
    loader = stoker.DataLoader(Augmented(40), batch_size=3, shuffle=True, seed="per_sample",
                               generator=torch.Generator().manual_seed(1), **kw)
    loader.load_state_dict(sd)
    return loader


KINDS = {"map": (_map, 1, 3), "skipping": (_skipping, 0, 4), "stateful_stream":
         (_stateful_stream, 0, 4), "stream": (_stream, 0, 3), "ranked": (_ranked, 0, 2),
         "own_sampler": (_own_sampler, 1, 2), "rebatched": (_rebatched, 0, 2)}


def _saved(kind, **kw):
    """(state mid-epoch, the batches the uninterrupted run gives after it: the rest of the
    epoch and the next one), for a loader of `kind`."""
    make, full_epochs, batches = KINDS[kind]
    loader = make(**kw)
    if kind == "ranked":
        loader.sampler.set_epoch(0)
    for _ in range(full_epochs):
        list(loader)
    it = iter(loader)
    for _ in range(batches):
        next(it)
    sd = loader.state_dict()
    rest = _rows(it)
    if kind == "ranked":
        loader.sampler.set_epoch(loader.sampler.epoch + 1)
    return sd, rest + _rows(loader)


def _resumed(kind, sd):
    make = KINDS[kind][0]
    loader = make()
    before = loader.state_dict()
    try:
        loader.load_state_dict(sd)
    except StateMismatchError:
        assert loader.state_dict() == before  # refused before anything changed
        raise
    it = iter(loader)
    rest = _rows(it)
    if kind == "ranked":
        loader.sampler.set_epoch(loader.sampler.epoch + 1)
    return rest + _rows(loader)


@pytest.mark.unit
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_state_is_plain_data_and_resumes_exactly(kind):
    sd, want = _saved(kind)
    _assert_plain(sd)
    assert (sd["rebatch"] is not None) == (kind == "rebatched")
    assert _resumed(kind, sd) == want


@pytest.mark.unit
def test_numpy_indices_and_skips_are_stored_as_python_ints():
    loader = stoker.DataLoader(FailsAt({5}, 24), batch_size=4, on_error="skip",
                               sampler=NumpyPermSampler(24, seed=1))
    list(loader)
    sd = loader.state_dict()
    assert [type(s[0]) for s in sd["skipped"]] == [int]
    _assert_plain(sd)


# -- a state that would run code if it were unpickled ----------------------------------------
class _Pwn:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_a_crafted_state_cannot_run_code(tmp_path):
    """stoker 0.1 pickled a stream's state into the checkpoint; a crafted one names a function
    to call. Loaded with torch.load(weights_only=True), as torch's default does, the state is
    refused before anything of it runs."""
    marker = tmp_path / "pwned"
    sd, _ = _saved("stateful_stream")
    v1 = {k: v for k, v in sd.items() if k not in ("digest", "sampler_states",
                                                     "sampler_states_now")}
    evil = dict(v1, version=1,
                worker_states=((0, pickle.dumps({"iterator": _Pwn(str(marker))})),))
    buf = io.BytesIO()
    torch.save(evil, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    loader = _stateful_stream()
    with pytest.raises(StateMismatchError, match="cannot be loaded safely.*posix.system"):
        loader.load_state_dict(loaded)
    with pytest.raises(StateMismatchError):
        _stateful_stream(num_workers=2).load_state_dict(loaded)
    assert not marker.exists()


@pytest.mark.unit
def test_a_later_state_relabelled_version_1_is_refused():
    """Version 1 had no digest: a later state that says version 1 would skip its check."""
    sd, _ = _saved("map")
    with pytest.raises(StateMismatchError, match="says version 1 but has digest"):
        _map().load_state_dict(dict(sd, version=1, position=sd["position"] - 1))
    sd, _ = _saved("stateful_stream")
    v1 = {k: v for k, v in sd.items() if k not in ("digest", "sampler_states",
                                                     "sampler_states_now")}
    with pytest.raises(StateMismatchError, match="version 1 saved each one as bytes"):
        _stateful_stream().load_state_dict(dict(v1, version=1, worker_states=((0, {"pos": 1}),)))


class _BlobState(StatefulStream):
    """A stream whose own state holds bytes: here, a pickle that would run code."""

    def __init__(self, n, blob):
        super().__init__(n)
        self.blob = blob

    def state_dict(self):
        return {"pos": self.pos, "blob": self.blob}


def test_bytes_in_a_state_are_never_unpickled(tmp_path):
    """In today's states a stream's state is plain data; bytes there are the dataset's own
    opaque value, saved and handed back as they are, never unpickled by stoker."""
    marker = tmp_path / "pwned"
    blob = pickle.dumps(_Pwn(str(marker)))
    loader = stoker.DataLoader(_BlobState(24, blob), batch_size=3, num_workers=2)
    it = iter(loader)
    next(it)
    sd = loader.state_dict()
    del it
    assert any(st.get("dataset", {}).get("blob") == blob for _, st in sd["worker_states"])
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    resumed = stoker.DataLoader(_BlobState(24, b""), batch_size=3, num_workers=2)
    resumed.load_state_dict(torch.load(buf, weights_only=True))
    list(resumed)
    assert not marker.exists()


@pytest.mark.unit
def test_a_changed_value_in_range_is_refused_by_the_digest():
    """A base seed, an RNG state or a position edited to another valid value would resume
    other data: the state's digest says it is not the one saved."""
    sd, _ = _saved("map")
    for field, value in (("base_seed", sd["base_seed"] + 1), ("position", sd["position"] - 1),
                         ("torch_rng", base64.b64encode(bytes(len(base64.b64decode(
                             sd["torch_rng"])))).decode())):
        with pytest.raises(StateMismatchError, match="do not match its digest"):
            _map().load_state_dict(dict(sd, **{field: value}))
    with pytest.raises(StateMismatchError, match="digest is None"):
        _map().load_state_dict({k: v for k, v in sd.items() if k != "digest"})


def test_a_state_that_is_not_plain_data_is_refused_when_taken_naming_the_type():
    loader = stoker.DataLoader(OpaqueStateStream(12), batch_size=3, num_workers=2)
    with pytest.raises(RuntimeError, match="OpaqueStateStream.Handle.*plain data"):
        list(loader)
    loader = stoker.DataLoader(OpaqueStateStream(12), batch_size=3)
    with pytest.raises(TypeError, match=r"\['reader'\] is a .*OpaqueStateStream.Handle"):
        list(loader)


# -- the wrong states the issue names ---------------------------------------------------------
@pytest.mark.unit
@pytest.mark.parametrize("field,value,match", [
    ("position", -3, "position is -3"),
    ("position", 99, "position is 99 .*at most the 10 batches"),
    ("finished", "no", "finished is 'no'"),
    ("generators", (), "generators is \\(\\)"),
    ("epoch", None, "epoch is None"),
    ("delivered_after", (1,), "delivered_after"),
    ("base_seed", 1 << 70, "base_seed"),
    ("torch_rng", b"short", "torch_rng"),
])
def test_a_wrong_field_is_refused_naming_it(field, value, match):
    sd, _ = _saved("map")
    with pytest.raises(StateMismatchError, match=match):
        _map().load_state_dict(dict(sd, **{field: value}))


@pytest.mark.unit
def test_a_missing_or_unknown_field_is_refused_naming_it():
    sd, _ = _saved("map")
    for key in ("epoch", "generators", "loader"):
        bad = {k: v for k, v in sd.items() if k != key}
        with pytest.raises(StateMismatchError, match=f"lacks {key}"):
            _map().load_state_dict(bad)
    with pytest.raises(StateMismatchError, match="does not know \\(extra\\)"):
        _map().load_state_dict(dict(sd, extra=1))


@pytest.mark.unit
def test_another_ranks_state_is_refused():
    sd, _ = _saved("ranked")
    ds = Augmented(30)
    other = stoker.DataLoader(ds, batch_size=2, sampler=DistributedSampler(
        ds, num_replicas=2, rank=0, shuffle=True, seed=3))
    with pytest.raises(StateMismatchError, match="rank: saved 1, here 0"):
        other.load_state_dict(sd)


# -- the fuzz ---------------------------------------------------------------------------------
FIELDS = sorted(k for k in _saved("map")[0] if k != "version") + ["version"]
_RETYPES = [None, "x", 1.5, [], {}, b"", True, -1, (0,), {"a": 1}]


def _mutate(sd, field, how, pick):
    out = dict(sd)
    if how == "drop":
        out.pop(field, None)
        return out
    v = out.get(field)
    if how == "retype":
        out[field] = _RETYPES[pick % len(_RETYPES)]
    elif how == "negate":
        out[field] = (-v - 1) if isinstance(v, int) and not isinstance(v, bool) else \
            (not v if isinstance(v, bool) else None)
    elif how == "enlarge":
        if isinstance(v, bool):
            out[field] = not v
        elif isinstance(v, int):
            out[field] = v + 1000 * (pick + 1)
        elif isinstance(v, bytes):
            out[field] = v + b"\x00" * (pick + 1)
        elif isinstance(v, (tuple, list)):
            out[field] = tuple(v) + (tuple(v)[:1] or (pick,))
        elif isinstance(v, dict):
            out[field] = dict(v, extra=pick)
        else:
            out[field] = pick
    return out


_STATES = {kind: _saved(kind) for kind in sorted(KINDS)}


@pytest.mark.unit
@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(sorted(KINDS)), field=st.sampled_from(FIELDS),
       how=st.sampled_from(["drop", "retype", "negate", "enlarge"]),
       pick=st.integers(0, 9))
@pytest.mark.parametrize("resealed", [False, True])
def test_fuzz_a_damaged_state_is_refused_or_resumes_exactly(resealed, kind, field, how, pick):
    """`resealed`: the digest is recomputed after the damage (a tool that rewrites states), so
    each field's own checks are what stand: a value in range is a valid state (another seed
    resumes other data, which no check can tell), but nothing may fail later, in iteration, with
    a bare KeyError or TypeError: it is refused when loaded, with a message, or it runs."""
    sd, want = _STATES[kind]
    bad = _mutate(sd, field, how, pick)
    if resealed and "digest" in bad and field != "digest":
        try:
            bad["digest"] = state_digest({k: bad[k] for k in State.keys() if k in bad})
        except TypeError:
            pass  # not plain data: refused as such
    try:
        got = _resumed(kind, bad)
    except StateMismatchError as e:
        assert str(e).startswith("stoker: "), e
        return
    if not resealed:
        assert got == want, (kind, field, how, bad.get(field))


def test_a_sampler_with_its_own_state_resumes_mid_epoch_two_and_after():
    """A sampler drawing from its own NumPy generator, saved mid-epoch 2 and resumed in a new
    loader (a new process): the rest of epoch 2 and epoch 3 are the uninterrupted run's."""
    loader = _own_sampler()
    list(loader)
    it = iter(loader)
    head = [as_lists([next(it)]) for _ in range(2)]
    sd = loader.state_dict()
    want = [as_lists([b]) for b in it] + [as_lists([b]) for b in loader]
    fresh = _own_sampler(num_workers=2)
    fresh.load_state_dict(sd)
    got = [as_lists([b]) for b in fresh] + [as_lists([b]) for b in fresh]
    assert got == want and len(head) == 2
    # a finished epoch: the next one starts from the sampler's state when it was taken
    sd_end = fresh.state_dict()
    want_next = [as_lists([b]) for b in fresh]
    again = _own_sampler()
    again.load_state_dict(sd_end)
    assert [as_lists([b]) for b in again] == want_next


@pytest.mark.unit
def test_numpy_states_of_a_sampler_are_plain():
    loader = _own_sampler()
    next(iter(loader))
    sd = loader.state_dict()
    assert "sampler" in sd["sampler_states"]
    _assert_plain(sd)
    assert isinstance(np.random.default_rng().bit_generator.state, dict)
