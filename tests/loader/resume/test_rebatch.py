"""Resuming under another batch size (loader/resume/rebatch.py), on real workers: the rest of
the saved epoch, in the saved order, cut into batches of the new size (the last short, or
dropped under drop_last), and the epochs after it those of an uninterrupted run of the new
settings. Each case is compared sample by sample with the saved epoch's order (what an
uninterrupted loader with batch_size=1 yields) re-batched by the new size. The refusals are
checked by their messages."""

from __future__ import annotations

import collections
import io
import json

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, DistributedSampler, RandomSampler, SequentialSampler

import stoker
from resume_datasets import NumpyPermSampler, StatefulStream, Stream
from stoker import StateMismatchError
from stoker.loader.resume.state import State

N = 50  # samples: batch sizes 8, 12, 5, 3, 16 leave short last batches


def make(batch_size, workers=0, drop_last=False, seed=3, **kw):
    kw.setdefault("shuffle", True)
    kw.setdefault("generator", torch.Generator().manual_seed(seed))
    return stoker.DataLoader(list(range(N)), batch_size=batch_size, num_workers=workers,
                             drop_last=drop_last, **kw)


def lists(batches):
    """Batches as lists (a stream's batch, a list of tensors, as it is)."""
    return [b.tolist() if hasattr(b, "tolist") else b for b in batches]


def saved(sd):
    """Through a checkpoint file (torch.save, then torch.load's default weights_only)."""
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    return torch.load(buf)


def cut(samples, b, drop_last):
    out = [samples[i:i + b] for i in range(0, len(samples), b)]
    return out[:-1] if drop_last and out and len(out[-1]) < b else out


def orders(epochs=2, **kw):
    """Each epoch's sampler order (the batch size does not change it: one randperm an epoch)."""
    loader = make(1, **kw)
    return [[i for b in lists(loader) for i in b] for _ in range(epochs)]


def take(loader, k):
    it = iter(loader)
    got = lists(next(it) for _ in range(k))
    sd = loader.state_dict()
    del it  # prefetched batches die with the job
    return got, sd


@pytest.mark.parametrize("old,new,drop_last,save_workers,load_workers", [
    (8, 4, False, 2, 2),   # smaller, dividing
    (8, 12, True, 2, 1),   # larger, another num_workers
    (8, 5, False, 1, 2),   # not dividing
    (8, 3, True, 2, 0),    # not dividing, into one process
    (6, 16, False, 0, 2),  # larger, from one process into workers
])
def test_the_rest_of_the_epoch_in_batches_of_the_new_size(old, new, drop_last, save_workers,
                                                          load_workers):
    order = orders()
    got, sd = take(make(old, save_workers, drop_last), 3)
    assert [i for b in got for i in b] == order[0][:3 * old]
    resumed = make(new, load_workers, drop_last, seed=99)  # the state decides the order
    resumed.load_state_dict(saved(sd))
    rest = cut(order[0][3 * old:], new, drop_last)
    assert len(resumed) == 3 + len(rest)  # the epoch's batches: 3 received, then the rest's
    assert lists(resumed) == rest
    assert len(resumed) == len(make(new, drop_last=drop_last))  # the loader's own again
    # The epoch after is an uninterrupted run's of the new settings.
    fresh = make(new, load_workers, drop_last)
    list(fresh)
    assert lists(resumed) == lists(fresh) == cut(order[1], new, drop_last)


@pytest.mark.parametrize("drop_last", [False, True])
def test_resumed_again_inside_the_rebatched_epoch_under_a_third_size(drop_last):
    order = orders(drop_last=False)[0]
    _, sd = take(make(8, 2, drop_last), 2)
    second = make(5, 2, drop_last)
    second.load_state_dict(sd)
    assert len(second) == 2 + len(cut(order[16:], 5, drop_last))
    got, sd2 = take(second, 3)
    assert got == cut(order[16:], 5, drop_last)[:3]
    assert sd2["rebatch"] == {"prefix": 16, "also": ()} and sd2["position"] == 3
    assert sd2["delivered_all"] is False
    third = make(12, 1, drop_last)
    third.load_state_dict(json.loads(json.dumps(saved(sd2))))  # JSON carries it too
    assert len(third) == 5 + len(cut(order[31:], 12, drop_last))
    assert lists(third) == cut(order[31:], 12, drop_last)
    # and the same size again: the rest of the second's batches, as they were
    again = make(5, 0, drop_last)
    again.load_state_dict(sd2)
    assert lists(again) == cut(order[16:], 5, drop_last)[3:]


def test_batches_delivered_out_of_order_are_taken_out():
    # in_order=False delivers a batch ahead of the ones before it: a state says so in
    # delivered_after. Batches 0, 1 and 4 (of 8) delivered: the rest is the order less them.
    order = orders()[0]
    _, sd = take(make(8, 2), 5)
    sd = State.from_dict(sd).replace(position=2, delivered_after=(4,)).to_dict()
    resumed = make(6, 2)
    resumed.load_state_dict(sd)
    rest = [i for k, i in enumerate(order) if not (k < 16 or 32 <= k < 40)]
    assert resumed.state_dict()["rebatch"] == {"prefix": 16, "also": tuple(range(32, 40))}
    got, sd2 = take(resumed, 2)
    assert got == cut(rest, 6, False)[:2]
    third = make(7, 0)
    third.load_state_dict(sd2)
    assert lists(third) == cut(rest[12:], 7, False)


def test_persistent_workers_and_the_epochs_after():
    order = orders(3, workers=2, persistent_workers=True)
    _, sd = take(make(8, 2, persistent_workers=True), 4)
    resumed = make(12, 2, persistent_workers=True)
    resumed.load_state_dict(saved(sd))
    assert lists(resumed) == cut(order[0][32:], 12, False)
    fresh = make(12, 2, persistent_workers=True)
    list(fresh)
    for e in (1, 2):
        assert lists(resumed) == lists(fresh) == cut(order[e], 12, False)


def test_a_sampler_with_its_own_state():
    def loader(b, workers):
        return stoker.DataLoader(list(range(N)), batch_size=b, num_workers=workers,
                                 sampler=NumpyPermSampler(N, seed=4))

    ref = loader(1, 0)
    order = [[i for b in lists(ref) for i in b] for _ in range(2)]
    _, sd = take(loader(8, 2), 2)
    resumed = loader(5, 2)
    resumed.load_state_dict(saved(sd))
    assert lists(resumed) == cut(order[0][16:], 5, False)
    assert lists(resumed) == cut(order[1], 5, False)  # the sampler's generator went on


# -- with another world size, or each rank its own state ------------------------------------------
def rank_loaders(world, batch_size, workers=0, drop_last=False):
    """One loader per rank of a `world`-rank job; `workers`: each rank's num_workers (a
    function of the rank), or one for all."""
    out = []
    for r in range(world):
        s = DistributedSampler(list(range(48)), num_replicas=world, rank=r, seed=7,
                               drop_last=drop_last)
        s.set_epoch(2)
        out.append(stoker.DataLoader(list(range(48)), batch_size=batch_size, sampler=s,
                                     num_workers=workers(r) if callable(workers) else workers))
    return out


def run_ranks(loaders, takes):
    got, states = [], []
    for loader, k in zip(loaders, takes):
        if k is None:
            got.append(lists(loader))
            states.append(loader.state_dict())
        else:
            g, sd = take(loader, k)
            got.append(g)
            states.append(sd)
    return got, states


def global_order(world, drop_last=False):
    """The saved epoch's global order: rank r takes [r::world]."""
    parts = []
    for r in range(world):
        s = DistributedSampler(list(range(48)), num_replicas=world, rank=r, seed=7,
                               drop_last=drop_last)
        s.set_epoch(2)
        parts.append(list(s))
    out = np.empty(sum(map(len, parts)), dtype=np.int64)
    for r, p in enumerate(parts):
        out[r::world] = p
    return out


@pytest.mark.parametrize("drop_last", [False, True])
def test_another_world_size_and_batch_size_in_one_resume(drop_last):
    # 3 ranks of batches of 4 delivered 2, 3 and 1 batches; 5 ranks of batches of 3 (with
    # workers) split the rest (24) in saved order: padded to 25 as DistributedSampler pads,
    # or cut to 20 under its drop_last.
    takes = [2, 3, 1]
    _, st = run_ranks(rank_loaders(3, 4, drop_last=drop_last), takes)
    order = global_order(3, drop_last)
    delivered = np.zeros(len(order), dtype=bool)
    for r, k in enumerate(takes):
        delivered[[r + j * 3 for j in range(4 * k)]] = True
    rest = order[~delivered].tolist()
    rest = rest[:20] if drop_last else rest + rest[:1]

    def five(b):
        return rank_loaders(5, b, workers=lambda r: r % 2, drop_last=drop_last)

    ranks = five(3)
    for loader in ranks:
        loader.load_state_dict([saved(s) for s in st])
    assert [len(loader) for loader in ranks] == [2] * 5  # 5 (or 4) each, in 3s
    whole, _ = run_ranks(ranks, [None] * 5)
    for r in range(5):
        assert whole[r] == cut(rest[r::5], 3, False)
    ranks = five(3)
    for loader in ranks:
        loader.load_state_dict(st)
    got, st2 = run_ranks(ranks, [1] * 5)
    # Each rank resumed again on its own, under a third batch size.
    again = five(2)
    for loader, sd in zip(again, st2):
        loader.load_state_dict(sd)
        assert len(loader) == 2  # one batch of 3 received, the rest (2, or 1) in one of 2
    third, _ = run_ranks(again, [None] * 5)
    for r in range(5):
        assert got[r] + third[r] == cut(rest[r::5][:3], 3, False) + cut(rest[r::5][3:], 2, False)


def test_each_rank_resumes_its_own_state_under_another_batch_size():
    _, st = run_ranks(rank_loaders(2, 4), [3, 2])
    resumed = rank_loaders(2, 6, workers=2)
    for loader, sd in zip(resumed, st):
        loader.load_state_dict(saved(sd))
    got, _ = run_ranks(resumed, [None, None])
    for r, k in enumerate([3, 2]):
        mine = list(rank_loaders(2, 1)[r].sampler)
        assert got[r] == cut(mine[4 * k:], 6, False)


def test_a_resized_epoch_saved_under_one_batch_size_resized_again_under_another():
    _, st = run_ranks(rank_loaders(3, 4), [1, 1, 1])
    per_rank = rank_loaders(3, 5)
    for loader, sd in zip(per_rank, st):
        loader.load_state_dict(sd)  # each rank its own state, re-batched in 5s
    g1, st1 = run_ranks(per_rank, [1, 2, 1])
    four = rank_loaders(4, 3, workers=2)
    for loader in four:
        loader.load_state_dict(st1)  # all ranks' states: counted in their own batches of 5
    g2, _ = run_ranks(four, [None] * 4)
    counts = collections.Counter(i for g in (g1, g2) for rank in g for b in rank for i in b)
    counts.update(i for rank in run_ranks(rank_loaders(3, 4), [1, 1, 1])[0] for b in rank
                  for i in b)
    assert sorted(counts) == list(range(48)) and set(counts.values()) == {1}, counts
    assert len({len(rank) for rank in g2}) == 1  # as many steps on every rank


# -- streams ----------------------------------------------------------------------------------
def rows(batch):
    return [tuple(r[:2]) for r in zip(*(t.tolist() for t in batch))]


def test_a_stateful_stream_continues_each_worker_in_the_new_batch_size():
    def stream(b):
        return stoker.DataLoader(StatefulStream(40), batch_size=b, num_workers=2)

    # Batches of 4 go round the 2 workers: worker 0 had delivered 2, worker 1 one.
    _, sd = take(stream(4), 3)
    resumed = stream(3)
    resumed.load_state_dict(saved(sd))
    per_worker = collections.defaultdict(list)
    for b in resumed:
        assert len(b[0]) <= 3
        for w, i in rows(b):
            per_worker[w].append(i)
    assert per_worker[0] == list(range(16, 40, 2))
    assert per_worker[1] == list(range(9, 40, 2))


def test_what_cannot_be_rebatched_is_refused_saying_why():
    stream = stoker.DataLoader(Stream(30), batch_size=4, num_workers=2)
    _, sd = take(stream, 1)
    with pytest.raises(StateMismatchError, match=r"(?s)has no state of its own.*Resume with "
                       r"batch_size=4.*state_dict\(\) and load_state_dict"):
        stoker.DataLoader(Stream(30), batch_size=3, num_workers=2).load_state_dict(sd)
    fresh = stoker.DataLoader(Stream(30), batch_size=4, num_workers=2).state_dict()
    stoker.DataLoader(Stream(30), batch_size=3, num_workers=2).load_state_dict(fresh)  # nothing
    # delivered yet: fine

    own = stoker.DataLoader(list(range(N)), batch_size=None)
    _, sd = take(own, 3)
    with pytest.raises(StateMismatchError, match=r"batch_size=None \(each item of the dataset "
                       r"is a batch it made itself\), this one has batch_size=4"):
        make(4).load_state_dict(sd)

    def custom(b):
        return stoker.DataLoader(list(range(N)), batch_sampler=BatchSampler(
            SequentialSampler(range(N)), b, False))

    _, sd = take(custom(8), 2)
    with pytest.raises(StateMismatchError, match=r"a custom batch_sampler: stoker replays it as "
                       r"it was saved and cannot re-batch"):
        custom(5).load_state_dict(sd)
    _, sd = take(make(8), 2)
    with pytest.raises(StateMismatchError, match=r"saved loader had batch_size=8, this one has "
                       r"a custom batch_sampler"):
        custom(8).load_state_dict(sd)


def test_a_sampler_of_another_length_is_refused_even_in_another_batch_size():
    def loader(b, n):
        return stoker.DataLoader(list(range(N)), batch_size=b, sampler=RandomSampler(
            range(N), num_samples=n, generator=torch.Generator().manual_seed(3)))

    _, sd = take(loader(8, N), 2)
    with pytest.raises(StateMismatchError, match=r"batch_size: saved 8, here 5\n.*\n  - \(with "
                       r"the saved batch_size this loader would make 4 batches an epoch: its "
                       r"sampler yields another number of samples"):
        loader(5, 30).load_state_dict(sd)
    loader(5, N).load_state_dict(sd)
