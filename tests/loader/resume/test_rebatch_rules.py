"""Resuming under another batch size in one process (num_workers=0), through what a user calls:
which states load under another batch size and which are refused (the refusal's message says
why and what to do), what the resumed loader delivers, the len(loader) it reports, and the
state it saves again (loader/resume/rebatch.py's rules; tests/loader/resume/test_rebatch.py
has the same resumes on real workers)."""

from __future__ import annotations

import pytest
from torch.utils.data import BatchSampler, DistributedSampler, Sampler, SequentialSampler

import stoker
from resume_datasets import StatefulStream, Stream
from stoker import StateMismatchError
from stoker.loader.resume.state import State

pytestmark = pytest.mark.unit  # no process (tests/support/tiers.py)

N = 50


def loader(b, n=N, **kw):
    return stoker.DataLoader(list(range(n)), batch_size=b, **kw)


def take(ld, k):
    """`k` batches (as lists) received inside the loop, and the state then."""
    it = iter(ld)
    got = [_plain(next(it)) for _ in range(k)]
    return got, ld.state_dict()


def _plain(b):
    if hasattr(b, "tolist"):
        return b.tolist()
    return [_plain(x) for x in b] if isinstance(b, (list, tuple)) else b


def every(ld):
    return [_plain(b) for b in ld]


def cut(samples, b, drop_last=False):
    out = [samples[i:i + b] for i in range(0, len(samples), b)]
    return out[:-1] if drop_last and out and len(out[-1]) < b else out


def refusal(ld, sd) -> str:
    with pytest.raises(StateMismatchError) as e:
        ld.load_state_dict(sd)
    return str(e.value)


def edited(sd, **fields):
    """The state `sd` with some fields changed (and its digest made again)."""
    return State.from_dict(sd).replace(**fields).to_dict()


# -- what resumes, and what it delivers ---------------------------------------------------------
def test_a_state_saved_with_batch_size_1_resumes_in_another():
    got, sd = take(loader(1), 7)
    resumed = loader(4)
    resumed.load_state_dict(sd)
    assert len(resumed) == 7 + 11  # 43 left: ten batches of 4 and one of 3
    assert every(resumed) == cut(list(range(7, N)), 4)


def test_drop_last_drops_the_short_batch_of_the_rest():
    # 50 samples: 6 batches of 8 under drop_last (2 dropped), 3 received; the rest (26) is 5
    # batches of 5, the last sample dropped.
    _, sd = take(loader(8, drop_last=True), 3)
    assert sd["loader"]["batches_per_epoch"] == 6
    resumed = loader(5, drop_last=True)
    resumed.load_state_dict(sd)
    assert len(resumed) == 3 + 5
    assert every(resumed) == cut(list(range(24, N)), 5, drop_last=True)
    assert every(resumed) == cut(list(range(N)), 5, drop_last=True)  # the next epoch: its own


def test_batches_delivered_ahead_are_not_delivered_again():
    # Batches 0, 1 and 4 (of 8) had been received (in_order=False delivers ahead).
    _, sd = take(loader(8), 5)
    sd = edited(sd, position=2, delivered_after=(4,), batches_yielded=3)
    resumed = loader(6)
    resumed.load_state_dict(sd)
    rest = [i for i in range(N) if not (i < 16 or 32 <= i < 40)]  # 26
    assert len(resumed) == 3 + 5
    again = resumed.state_dict()
    assert (again["position"], again["delivered_after"]) == (0, ())  # in batches of 6 now
    assert every(resumed) == cut(rest, 6)


def test_a_state_saved_after_the_last_batch_resumes_with_an_empty_rest():
    # All 7 batches of 8 (the last of 2) received inside the loop: nothing is left.
    _, sd = take(loader(8), 7)
    assert sd["delivered_all"] is True
    resumed = loader(12)
    resumed.load_state_dict(sd)
    again = resumed.state_dict()
    assert again["rebatch"] == {"prefix": N, "also": ()}  # the 50 samples, no more
    assert (len(resumed), again["delivered_all"]) == (7, True)
    loader(5).load_state_dict(again)  # and it loads again, under a third size
    assert every(resumed) == []
    assert len(resumed) == 5  # the next epoch: the loader's own


def test_the_last_batch_of_a_rebatched_epoch_and_the_state_after_it():
    _, sd = take(loader(8), 3)
    second = loader(12)
    second.load_state_dict(sd)
    got, sd2 = take(second, 3)  # the whole rest, inside the loop
    assert got == cut(list(range(24, N)), 12)
    assert (len(second), sd2["delivered_all"]) == (6, True)
    third = loader(12)
    third.load_state_dict(sd2)
    assert len(third) == 6  # 6 received, none left
    assert every(third) == []


class Lengthless(Sampler):
    """0..n-1 in order, without a length (len(loader) is unknown)."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


def test_a_sampler_without_a_length():
    _, sd = take(loader(8, sampler=Lengthless(N)), 2)
    assert sd["delivered_all"] is None  # it cannot tell
    resumed = loader(5, sampler=Lengthless(N))
    resumed.load_state_dict(sd)
    assert every(resumed) == cut(list(range(16, N)), 5)
    # and a finished epoch's state: the next epoch is whole, in the new size
    finished = resumed.state_dict()
    assert finished["finished"] is True
    again = loader(7, sampler=Lengthless(N))
    again.load_state_dict(finished)
    assert every(again) == cut(list(range(N)), 7)


def ranks(world, b, n=12):
    """Rank loaders of a `world`-rank job: DistributedSampler's share of n, in order."""
    return [stoker.DataLoader(list(range(n)), batch_size=b, sampler=DistributedSampler(
        list(range(n)), num_replicas=world, rank=r, shuffle=False)) for r in range(world)]


def test_an_elastic_epochs_share_counts_its_own_batches_in_another_batch_size():
    # 3 ranks received a batch of 2 each (6 of 12); 2 ranks split the rest: 3 each, in 2
    # batches of 2 (their samplers' own epoch would be 6, in 3).
    states = [take(ld, 1)[1] for ld in ranks(3, 2)]
    rank0 = ranks(2, 2)[0]
    rank0.load_state_dict(states)
    assert len(rank0) == 2
    got, sd = take(rank0, 2)
    assert got == [[6, 8], [10]]
    assert (sd["delivered_all"], len(rank0)) == (True, 2)
    # Under another batch size: the share's 3 samples were received, no more.
    four = ranks(2, 4)[0]
    four.load_state_dict(sd)
    again = four.state_dict()
    assert again["rebatch"] == {"prefix": 3, "also": ()}
    assert len(four) == 2
    three = ranks(2, 3)[0]
    three.load_state_dict(again)  # loads again, under a third size
    assert every(three) == []


# -- streams ------------------------------------------------------------------------------------
def test_a_stream_with_state_continues_in_the_new_batch_size():
    _, sd = take(stoker.DataLoader(StatefulStream(40), batch_size=4), 2)
    resumed = stoker.DataLoader(StatefulStream(40), batch_size=3)
    resumed.load_state_dict(sd)
    again = resumed.state_dict()  # checkpointed again before it is iterated
    assert (again["rebatch"], again["position"], again["batches_yielded"]) == (None, 2, 2)
    third = stoker.DataLoader(StatefulStream(40), batch_size=5)
    third.load_state_dict(again)
    items = [i for b in third for i in b[1].tolist()]
    assert items == list(range(8, 40))


def stream(b):
    return stoker.DataLoader(Stream(30), batch_size=b)


STREAM_REASON = (
    "(this IterableDataset has no state of its own: stoker resumes it by reading each worker's "
    "stream again and dropping {k} you had received, and those are 4 samples each, "
    "which a loader with batch_size=3 does not know how to drop. Resume with batch_size=4 until "
    "the epoch ends, or give the dataset (or the iterator its __iter__ returns) state_dict() "
    "and load_state_dict(state), so that each worker's stream continues from its position "
    "under any batch size)")


def test_a_stream_without_state_is_refused_once_it_delivered():
    _, sd = take(stream(4), 2)
    said = refusal(stream(3), sd)
    assert "  - batch_size: saved 4, here 3\n" in said
    assert STREAM_REASON.format(k="the 2 batches") in said
    stream(4).load_state_dict(sd)  # in its own batch size it resumes
    # a batch received ahead of the first (in_order=False): received all the same
    ahead = edited(sd, position=0, delivered_after=(1,), batches_yielded=1)
    assert STREAM_REASON.format(k="the batch") in refusal(stream(3), ahead)


def test_a_stream_without_state_loads_in_another_size_before_it_delivered():
    fresh = stream(4).state_dict()
    assert fresh["finished"] is True
    resumed = stream(3)
    resumed.load_state_dict(fresh)
    assert every(resumed) == cut(list(range(30)), 3)
    begun = stream(4)
    it = iter(begun)  # an epoch begun, nothing received yet
    sd = begun.state_dict()
    assert (sd["finished"], sd["batches_yielded"], sd["position"]) == (False, 0, 0)
    del it
    resumed = stream(3)
    resumed.load_state_dict(sd)
    assert every(resumed) == cut(list(range(30)), 3)


# -- what is refused, and the refusal's reason --------------------------------------------------
def custom(b, n=N):
    return stoker.DataLoader(list(range(n)), batch_sampler=BatchSampler(
        SequentialSampler(range(N)), b, False))


CUSTOM_REASON = (
    "(a custom batch_sampler: stoker replays it as it was saved and cannot re-batch the rest "
    "of its epoch, because it does not know which samples its batches hold. Resume with the "
    "batch sampler built as the saved run built it, or use batch_size= with a sampler: torch's "
    "BatchSampler, whose rest stoker re-batches under another batch size)")


def test_a_custom_batch_sampler_of_another_size_is_refused_saying_why():
    _, sd = take(custom(8), 2)
    said = refusal(custom(5), sd)
    assert "  - batches_per_epoch: saved 7, here 10\n" in said
    assert CUSTOM_REASON in said
    custom(8).load_state_dict(sd)


def test_a_refusal_for_what_is_not_the_batch_size_says_nothing_of_re_batching():
    # The same batches, another dataset length: that is what differs, and all it says.
    _, sd = take(custom(8), 2)
    said = refusal(custom(8, n=60), sd)
    assert "  - dataset_length: saved 50, here 60\nBuild the loader" in said
    # The same batch size, a sampler of another length: the batch count differs, and that is
    # all.
    _, sd = take(loader(8), 2)
    said = refusal(loader(8, n=60), sd)
    assert "batch_sampler" not in said and "re-batch" not in said


BATCHING_REASON = (
    "stoker re-batches the rest of an epoch only between batch sizes of torch's BatchSampler, "
    "because it does not know which samples a dataset's own batches or a custom "
    "batch_sampler's hold. Resume with the batching the state was saved with, finish that "
    "epoch, then change it)")


def test_another_kind_of_batching_is_refused_naming_both():
    _, sd = take(loader(8), 2)
    said = refusal(custom(8), sd)
    assert ("(the saved loader had batch_size=8, this one has a custom batch_sampler "
            "(torch.utils.data.sampler.BatchSampler): " + BATCHING_REASON) in said
    _, sd = take(custom(8), 2)
    said = refusal(loader(8), sd)
    assert ("(the saved loader had a custom batch_sampler (torch.utils.data.sampler."
            "BatchSampler), this one has batch_size=8: " + BATCHING_REASON) in said
    _, sd = take(loader(None), 3)
    said = refusal(loader(4), sd)
    assert ("(the saved loader had batch_size=None (each item of the dataset is a batch it "
            "made itself), this one has batch_size=4: ") in said


def test_a_saved_batch_size_that_is_not_one_is_refused_as_edited():
    _, sd = take(loader(8), 2)
    for bad in (True, 0, "8"):
        sd["loader"]["batch_size"] = bad
        said = refusal(loader(5), sd)
        assert (f"(the saved batch_size is {bad!r}, not a batch size: the checkpoint was edited "
                "or made by another tool)") in said
