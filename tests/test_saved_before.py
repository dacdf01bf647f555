"""What stoker 0.1 saved still loads: a pickled loader (its records and resume point), and states
from ``state_dict()`` of each kind, each resuming with the batches 0.1 gave.

``data/stoker_0_1_states.pt`` was made by stoker 0.1 (commit 2222227, before the package was
split into subpackages): the pickled loader and the states, and the batches the uninterrupted
run yielded after each of them (what a resume must give).
"""

from __future__ import annotations

import os
import pickle

import torch
from torch.utils.data import DistributedSampler

import stoker
from resume_datasets import Augmented, StatefulStream, as_lists, indices

SAVED = torch.load(os.path.join(os.path.dirname(__file__), "data", "stoker_0_1_states.pt"),
                   weights_only=True)


def test_a_loader_pickled_by_0_1_unpickles_with_its_options_records_and_position():
    loader = pickle.loads(SAVED["loader_pickle"])
    assert isinstance(loader, stoker.DataLoader)
    assert (loader.on_error, loader.seed, loader.max_retries, loader.hang_timeout) == \
        ("skip", "per_sample", 2, 30.0)
    sd = loader.state_dict()
    old = SAVED["loader_state"]  # taken by 0.1 right after pickling (version 1)
    assert {k: sd[k] for k in old if k != "version"} == {k: v for k, v in old.items()
                                                          if k != "version"}
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
