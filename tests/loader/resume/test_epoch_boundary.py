"""A state saved inside the loop after an epoch's last batch resumes with that epoch's empty rest
(as torchdata does): the iteration that finishes it yields nothing, and stoker says so in one
WARNING line naming the epoch and both ways out. ``DataLoader.delivered_all(state)`` (the
state's ``delivered_all``) lets a training loop ask beforehand, of states of earlier versions
too."""

from __future__ import annotations

import logging

import pytest
import torch

import stoker
from resume_datasets import StatefulStream
from stoker.common.errors import StateMismatchError
from stoker.common.plain import digest
from stoker.loader.resume.state import State

N, B = 50, 8  # 7 batches an epoch, the last short


def make(workers=0, batch_size=B, **kw):
    return stoker.DataLoader(list(range(N)), batch_size=batch_size, shuffle=True,
                             num_workers=workers, generator=torch.Generator().manual_seed(5), **kw)


def lists(batches):
    return [b.tolist() for b in batches]


def reference(epochs=2, **kw):
    loader = make(**kw)
    return [lists(loader) for _ in range(epochs)]


def saves(workers=0):
    """(a state saved mid-epoch, one inside the loop after the last batch, one after the
    loop), all of epoch 1."""
    loader = make(workers)
    states = []
    for _ in loader:
        states.append(loader.state_dict())
    return states[2], states[-1], loader.state_dict()


def boundary_lines(caplog):
    return [r for r in caplog.records if r.name == "stoker" and r.levelno == logging.WARNING
            and "yielded nothing" in r.getMessage()]


def as_version_3(sd: dict) -> dict:
    """The state as stoker 0.3 wrote it: version 3, without the fields version 4 added, its
    digest over the others."""
    old = {k: v for k, v in sd.items() if k not in ("rebatch", "delivered_all", "digest")}
    old["version"] = 3
    keys = [k for k in State.keys() if k not in ("rebatch", "delivered_all")]
    old["digest"] = digest({k: old[k] for k in keys}, str_keys=True)
    return old


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resume_that_yields_nothing_says_which_epoch_and_what_to_do(workers, caplog):
    ref = reference()
    mid, inside, after = saves(workers)
    assert (inside["finished"], inside["delivered_all"]) == (False, True)
    assert stoker.DataLoader.delivered_all(inside) is True
    resumed = make(workers)
    resumed.load_state_dict(inside)
    with caplog.at_level(logging.WARNING, logger="stoker"):
        assert lists(resumed) == []  # the rest of epoch 1
    [line] = boundary_lines(caplog)
    msg = line.getMessage()
    assert "\n" not in msg
    for what in ("epoch 1 yielded nothing", "saved inside the loop after that epoch's last batch",
                 "Iterate the loader again for epoch 2", "save the state after the loop ends",
                 "DataLoader.delivered_all(state)"):
        assert what in msg, msg
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="stoker"):
        assert lists(resumed) == ref[1]  # iterated again: epoch 2, whole
    assert boundary_lines(caplog) == []


@pytest.mark.parametrize("workers", [0, 2])
def test_no_line_where_the_resume_yields_batches_or_the_loop_had_ended(workers, caplog):
    ref = reference()
    mid, inside, after = saves(workers)
    assert (after["finished"], after["delivered_all"]) == (True, True)
    assert (mid["finished"], mid["delivered_all"]) == (False, False)
    assert stoker.DataLoader.delivered_all(mid) is False
    with caplog.at_level(logging.WARNING, logger="stoker"):
        resumed = make(workers)
        resumed.load_state_dict(mid)
        assert lists(resumed) == ref[0][3:]
        resumed = make(workers)
        resumed.load_state_dict(after)
        assert lists(resumed) == ref[1]  # after the loop: the next epoch
        plain = make(workers)
        assert lists(plain) == ref[0]
        empty = stoker.DataLoader([], batch_size=B, num_workers=workers)
        assert lists(empty) == []  # an empty epoch, not resumed
    assert boundary_lines(caplog) == []


def test_under_another_batch_size_too(caplog):
    _, inside, _ = saves(2)
    resumed = make(2, batch_size=12)
    resumed.load_state_dict(inside)
    assert len(resumed) == 7  # the 7 batches it had, none left
    with caplog.at_level(logging.WARNING, logger="stoker"):
        assert lists(resumed) == []
    assert len(boundary_lines(caplog)) == 1
    assert len(resumed) == 5  # the loader's own


def test_a_state_saved_by_the_previous_version_loads_and_says_as_much():
    ref = reference()
    mid, inside, after = saves()
    old = [as_version_3(sd) for sd in (mid, inside, after)]
    assert [stoker.DataLoader.delivered_all(sd) for sd in old] == [False, True, True]
    resumed = make()
    resumed.load_state_dict(old[0])
    assert lists(resumed) == ref[0][3:]
    assert resumed.state_dict()["version"] == 4
    resumed = make(batch_size=5)  # under another batch size too
    resumed.load_state_dict(old[0])
    rest = [i for b in ref[0][3:] for i in b]
    assert lists(resumed) == [rest[i:i + 5] for i in range(0, len(rest), 5)]
    relabelled = dict(old[0], rebatch=None)
    with pytest.raises(StateMismatchError, match="says version 3 but has rebatch, which only "
                       "version 4 and later have"):
        make().load_state_dict(relabelled)


def test_delivered_all_of_a_stream_and_of_ranks():
    loader = stoker.DataLoader(StatefulStream(12), batch_size=3)
    it = iter(loader)
    next(it)
    assert stoker.DataLoader.delivered_all(loader.state_dict()) is None  # a stream cannot tell
    list(it)
    assert stoker.DataLoader.delivered_all(loader.state_dict()) is True
    _, inside, after = saves()
    assert stoker.DataLoader.delivered_all([inside, after]) is True
    assert stoker.DataLoader.delivered_all([inside, saves()[0]]) is False
    with pytest.raises(StateMismatchError, match="expects a dict made by"):
        stoker.DataLoader.delivered_all("not a state")
