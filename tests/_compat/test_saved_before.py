"""What stoker 0.1 saved still loads: a pickled loader (its records and resume point), and states
from ``state_dict()`` of each kind, each resuming with the batches 0.1 gave.

``data/stoker_0_1_states.pt`` was made by stoker 0.1 (commit 2222227, before the package was
split into subpackages): the pickled loader and the states, and the batches the uninterrupted
run yielded after each of them (what a resume must give). ``data/stoker_0_1_loaders_with_a_death.pt``
(made by ``data/make_stoker_0_1_loaders_with_a_death.py`` with 0.1) holds two ``torch.save``d
loaders that saw a worker die: a torch DataLoader served by ``enable()`` and a ``stoker.DataLoader``.
"""

from __future__ import annotations

import copy
import io
import os
import pickle
import types

import pytest
import torch
from torch.utils.data import DistributedSampler

import stoker
from resume_datasets import Augmented, StatefulStream, as_lists, indices
from stoker import _compat
from stoker._compat import v0_1
from stoker.common.deaths import Death
from stoker.config.records import SkippedSample
from stoker.loader.resume.state import State
from support.scenarios import (
    HERE,  # tests/
    run_ok,
)

DATA = os.path.join(HERE, "data")
SAVED = torch.load(os.path.join(DATA, "stoker_0_1_states.pt"), weights_only=True)
WITH_A_DEATH = os.path.join(DATA, "stoker_0_1_loaders_with_a_death.pt")


def test_a_loader_pickled_by_0_1_unpickles_with_its_options_records_and_position():
    loader = pickle.loads(SAVED["loader_pickle"])
    assert isinstance(loader, stoker.DataLoader)
    assert (loader.on_error, loader.seed, loader.max_retries, loader.hang_timeout) == \
        ("skip", "per_sample", 2, 30.0)
    sd = loader.state_dict()
    old = SAVED["loader_state"]  # taken by 0.1 right after pickling (version 1)
    now, then = State.from_dict(sd), State.from_dict(old)  # (buffers: base64 since 3)
    assert {k: getattr(now, k) for k in old if k != "version"} == \
        {k: getattr(then, k) for k in old if k != "version"}
    assert tuple((s.index, s.reason, s.epoch) for s in loader.skipped) == sd["skipped"]
    assert len(loader.skipped) == 1 and loader.stats()["epoch"] == 1
    loader.load_state_dict(sd)
    assert [b.tolist() for b in loader] == SAVED["loader_rest"]
    assert "_stoker_state" not in vars(loader) and "_stoker_resume" not in vars(loader)


def test_a_0_1_map_style_state_resumes_the_epoch_and_the_next():
    loader = stoker.DataLoader(Augmented(40), batch_size=4, shuffle=True,
                               generator=torch.Generator().manual_seed(1), num_workers=2,
                               seed="per_sample")
    loader.load_state_dict(SAVED["map_state"])
    assert as_lists(list(loader)) == SAVED["map_rest"]
    assert as_lists(list(loader)) == SAVED["map_next_epoch"]


def test_a_0_1_stateful_stream_state_resumes_each_worker():
    loader = stoker.DataLoader(StatefulStream(40), batch_size=3, num_workers=2)
    loader.load_state_dict(SAVED["stream_state"])
    got = [[t.tolist() for t in b] for b in loader]
    # [workers, items, reads]: the same items from the same workers; `reads` counts the items
    # an iterator produced since it was restored, so it starts again at 1 (not replayed)
    assert [b[:2] for b in got] == [b[:2] for b in SAVED["stream_rest"]]
    assert got[0][2] == [1, 2, 3] and SAVED["stream_rest"][0][2] == [7, 8, 9]


def test_0_1_states_of_two_ranks_resume_on_three():
    ds = Augmented(50)
    for r in range(3):
        s = DistributedSampler(ds, num_replicas=3, rank=r, shuffle=True, seed=5)
        d = stoker.DataLoader(ds, batch_size=2, sampler=s, num_workers=2)
        d.load_state_dict(SAVED["elastic_states"])
        assert indices(list(d)) == SAVED["elastic_rests"][r]


def test_0_1_loaders_saved_after_a_worker_death_keep_their_deaths_skips_and_quarantine():
    saved = torch.load(WITH_A_DEATH, weights_only=False)
    torch_loader, stoker_loader = saved["torch_loader"], saved["stoker_loader"]
    for loader in (torch_loader, stoker_loader):
        (death,) = stoker.stats(loader)["deaths"]
        assert (death["worker_id"], death["signal"], death["index"], death["epoch"]) == \
            (0, "SIGKILL", 5, 1)
    (death,) = stoker_loader.deaths
    assert type(death) is Death and death.tasks == [2, 4]
    assert [(type(s), s.index, s.epoch) for s in stoker_loader.skipped] == [(SkippedSample, 5, 1)]
    # Index 5 kills its worker whenever it is loaded: quarantined by 0.1, it is skipped now
    # without a second death.
    assert [b[1].tolist() for b in stoker_loader] == saved["batches"]
    stoker.enable(on_error="skip", quarantine_after=1)
    try:
        assert [b[1].tolist() for b in torch_loader] == saved["batches"]
    finally:
        stoker.disable()
    assert len(stoker_loader.deaths) == 1 and len(stoker.stats(torch_loader)["deaths"]) == 1


@pytest.mark.unit
def test_a_copy_of_a_0_1_loader_keeps_its_records_and_pickles_under_todays_names():
    loader = torch.load(WITH_A_DEATH, weights_only=False)["torch_loader"]
    assert type(vars(loader)["_stoker_state"]) is v0_1.LoaderState  # torch's loader: not folded
    copied = copy.deepcopy(loader)
    data = pickle.dumps(copied)
    assert b"stoker._state" not in data and b"stoker._checkpoint" not in data
    again = pickle.loads(data)
    assert stoker.stats(again)["deaths"] == stoker.stats(loader)["deaths"]
    assert [s["index"] for s in stoker.stats(again)["skipped"]] == [5]


class _Recording(pickle.Unpickler):
    """Records each (module, name) a pickle looks up."""

    seen: set = set()

    def find_class(self, module, name):
        _Recording.seen.add((module, name))
        return super().find_class(module, name)


@pytest.mark.unit
def test_the_old_names_are_exactly_those_0_1_pickles_name_and_lead_to_todays_classes():
    _Recording.seen.clear()
    _Recording(io.BytesIO(SAVED["loader_pickle"])).load()
    torch.load(WITH_A_DEATH, weights_only=False,
               pickle_module=types.SimpleNamespace(Unpickler=_Recording, __name__="pickle"))
    # stoker._loader is 0.2's path too: _compat/moved.py leads it to today's module
    assert ("stoker._loader", "DataLoader") in _Recording.seen
    old = {(m, n) for m, n in _Recording.seen if m.startswith("stoker.") and m != "stoker._loader"}
    assert old == {(m, n) for m, names in _compat.OLD_NAMES.items() for n in names}
    find = pickle.Unpickler(io.BytesIO()).find_class
    for module, name in old:
        assert find(module, name) is getattr(v0_1, name)
    assert find("stoker._fetch", "SkippedSample") is SkippedSample
    assert find("stoker._deaths", "Death") is Death


def test_a_0_1_pickle_loads_in_a_process_that_has_not_imported_stoker():
    run_ok("saved_before.torch_load_first", WITH_A_DEATH, timeout=120)
