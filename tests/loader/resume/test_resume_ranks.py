"""Checkpoint and resume across ranks, with real processes (torchrun, CPU, gloo): each rank
resuming its own state, and a job saved on 3 ranks resumed on 2 (elastic). Every sample of the
epoch must reach the model exactly once across the two runs. The in-process tests check the
split itself (padding, drop_last, a second resize inside one epoch) and the refusals."""

from __future__ import annotations

import collections
import json
import os

import pytest
from torch.utils.data.distributed import DistributedSampler

import stoker
from resume_datasets import Augmented, indices
from stoker import StateMismatchError
from support.frameworks import SCRIPTS, run

N, B = 48, 4  # as in frameworks/resume_ranks.py


def torchrun(ranks, phase, tmp_path):
    run(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
         os.path.join(SCRIPTS, "resume_ranks.py"), phase, str(tmp_path)], tmp_path,
        timeout=240, env={"OMP_NUM_THREADS": "1"})
    reps = [json.loads((tmp_path / f"{phase}.{r}").read_text()) for r in range(ranks)]
    assert [r["rank"] for r in reps] == list(range(ranks))
    return reps


def flat(batches):
    return [i for b in batches for i in b]


def test_each_rank_resumes_its_own_state_under_torchrun(tmp_path):
    saved = torchrun(2, "save-2,3", tmp_path)  # rank 1 was one batch ahead when killed
    resumed = torchrun(2, "own", tmp_path)
    epoch2 = []
    for r in range(2):
        sampler = DistributedSampler(Augmented(N), num_replicas=2, rank=r, seed=7)
        sampler.set_epoch(2)
        mine = flat(saved[r]["epoch2"]) + flat(resumed[r]["epoch2"])
        assert mine == list(sampler)  # this rank's order, uninterrupted
        epoch2 += mine
        assert flat(resumed[r]["epoch3"]) == resumed[r]["expected3"]
    assert sorted(epoch2) == list(range(N))  # every sample once across ranks and runs


def test_three_ranks_resumed_on_two_deliver_the_rest_of_the_epoch_once(tmp_path):
    saved = torchrun(3, "save-3,2,3", tmp_path)  # 8 of 12 batches delivered
    resumed = torchrun(2, "elastic", tmp_path)
    first = [i for rep in saved for i in flat(rep["epoch2"])]
    rest = [i for rep in resumed for i in flat(rep["epoch2"])]
    assert len(first) == 32 and len(rest) == 16
    counts = collections.Counter(first + rest)
    assert sorted(counts) == list(range(N)) and set(counts.values()) == {1}, counts
    assert len(resumed[0]["epoch2"]) == len(resumed[1]["epoch2"]) == 2  # same steps per rank
    for rep in resumed:  # the epoch after is the 2-rank sampler's own
        assert flat(rep["epoch3"]) == rep["expected3"]


# -- the split, in one process (each "rank" a loader with its own DistributedSampler) -----------
def rank_loaders(world, n=N, batch_size=B, drop_last=False, epoch=2, workers=0):
    out = []
    for r in range(world):
        s = DistributedSampler(Augmented(n), num_replicas=world, rank=r, seed=7,
                               drop_last=drop_last)
        s.set_epoch(epoch)
        out.append(stoker.DataLoader(Augmented(n), batch_size=batch_size, sampler=s,
                                     num_workers=workers))
    return out


def run_ranks(loaders, takes):
    """Each loader takes its count of batches (None: the rest); their indices and states."""
    got, states = [], []
    for loader, k in zip(loaders, takes):
        it = iter(loader)
        got.append(flat(indices(it if k is None else (next(it) for _ in range(k)))))
        states.append(loader.state_dict())
        del it
    return got, states


def test_resized_twice_in_one_epoch_then_back():
    # 3 ranks -> 2 -> 4 inside epoch 2: 48 samples, each delivered once (48 - 24 - 8 = 16
    # divides among 4 ranks without padding).
    got3, st3 = run_ranks(rank_loaders(3), [2, 2, 2])
    two = rank_loaders(2, workers=2)
    for loader in two:
        loader.load_state_dict(st3)
    got2, st2 = run_ranks(two, [1, 1])
    four = rank_loaders(4)
    for loader in four:
        loader.load_state_dict(st2)
    got4, _ = run_ranks(four, [None] * 4)
    every = flat(got3) + flat(got2) + flat(got4)
    assert sorted(every) == list(range(N))
    assert [len(g) for g in got4] == [4, 4, 4, 4]


@pytest.mark.unit
def test_the_rest_is_padded_or_cut_as_distributed_sampler_does():
    # 48 samples on 3 ranks; 5 batches of 4 delivered -> 28 left, over 3 ranks: 28 % 3 = 1.
    _, st = run_ranks(rank_loaders(3), [2, 2, 1])
    padded = rank_loaders(3, workers=0)
    for loader in padded:
        loader.load_state_dict(st)
    got, _ = run_ranks(padded, [None] * 3)
    rest = flat(got)
    assert len(rest) == 30 and len(set(rest)) == 28  # 2 samples twice, as the sampler pads
    _, st = run_ranks(rank_loaders(3, drop_last=True), [2, 2, 1])
    cut = rank_loaders(3, drop_last=True)
    for loader in cut:
        loader.load_state_dict(st)
    got, _ = run_ranks(cut, [None] * 3)
    assert len(flat(got)) == 27 and len(set(flat(got))) == 27  # 1 cut, as drop_last does


@pytest.mark.unit
def test_finished_ranks_resume_with_the_next_epoch():
    _, st = run_ranks(rank_loaders(2), [None, None])
    three = rank_loaders(3, epoch=3)
    for loader in three:
        loader.load_state_dict(st)
    got, _ = run_ranks(three, [None] * 3)
    assert sorted(flat(got)) == list(range(N))


@pytest.mark.unit
def test_elastic_resume_refusals_say_what_to_do():
    _, st = run_ranks(rank_loaders(3), [1, 1, 1])
    two = rank_loaders(2)
    with pytest.raises(StateMismatchError, match="states of all ranks"):
        two[0].load_state_dict(st[0])  # one rank's state on a job of another size
    with pytest.raises(StateMismatchError, match=r"got ranks \[0, 2\] of a 3-rank job"):
        two[0].load_state_dict([st[0], st[2]])
    other = rank_loaders(2, drop_last=True)
    with pytest.raises(StateMismatchError, match="drop_last=False"):
        other[0].load_state_dict(st)
    plain = stoker.DataLoader(Augmented(N), batch_size=B, shuffle=True)
    with pytest.raises(StateMismatchError, match="DistributedSampler"):
        plain.load_state_dict(st)
