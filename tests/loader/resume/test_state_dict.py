"""loader.state_dict() / load_state_dict(): the failures torchdata's StatefulDataLoader is known
for, each reproduced against stoker. The reference is always an uninterrupted run of the same
loader; with seed="per_sample" the batches' values, not just their indices, must match it."""

from __future__ import annotations

import io

import pytest
import torch

import stoker
from resume_datasets import Augmented, as_lists, indices
from stoker import StateMismatchError

N, B = 40, 4  # 10 batches an epoch


def make(num_workers=0, seed=1, **kw):
    kw.setdefault("shuffle", True)
    kw.setdefault("generator", torch.Generator().manual_seed(seed))
    return stoker.DataLoader(Augmented(N), batch_size=B, num_workers=num_workers,
                             seed="per_sample", **kw)


def reference(epochs=2, **kw):
    loader = make(**kw)
    return [as_lists(loader) for _ in range(epochs)]


def saved(sd):
    """What a checkpoint file gives back (torch.load's default, weights_only)."""
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    return torch.load(buf)


def take(it, k):
    return as_lists(next(it) for _ in range(k))


@pytest.mark.parametrize("save_workers,load_workers", [(0, 0), (2, 2), (0, 4), (4, 0), (2, 4)])
def test_resume_mid_epoch_under_any_num_workers(save_workers, load_workers):
    ref = reference()
    loader = make(save_workers, prefetch_factor=3 if save_workers else None)
    it = iter(loader)
    got = take(it, 3)
    sd = saved(loader.state_dict())
    assert (sd["epoch"], sd["position"], sd["finished"]) == (1, 3, False)
    del it  # prefetched batches die with the job
    again = make(load_workers, seed=99)  # another generator seed: the state decides the order
    again.load_state_dict(sd)
    got += as_lists(again)
    assert got == ref[0]
    assert as_lists(again) == ref[1]  # the next epoch too


def test_two_and_three_resumes_in_one_epoch():
    ref = reference()
    got, sd = [], None
    for workers, k in [(2, 2), (0, 3), (2, 1), (4, 0)]:  # three resumes, the last saves at once
        loader = make(workers)
        if sd is not None:
            loader.load_state_dict(saved(sd))
        it = iter(loader)
        got += take(it, k)
        sd = loader.state_dict()
        del it
    loader = make(2)
    loader.load_state_dict(sd)
    got += as_lists(loader)
    assert got == ref[0]
    assert as_lists(loader) == ref[1]


@pytest.mark.parametrize("workers", [0, 2])
def test_state_dict_right_after_a_resume(workers):
    ref = reference()
    loader = make(workers)
    it = iter(loader)
    got = take(it, 4)
    sd = saved(loader.state_dict())
    del it
    resumed = make(workers)
    resumed.load_state_dict(sd)
    again = resumed.state_dict()  # before iter()
    it = iter(resumed)
    after_iter = resumed.state_dict()  # after iter(), before a batch (prefetching under way)
    for s in (again, after_iter):
        assert (s["epoch"], s["position"], s["finished"]) == (1, 4, False)
    del it
    third = make(workers)
    third.load_state_dict(saved(after_iter))
    got += as_lists(third)
    assert got == ref[0]


@pytest.mark.parametrize("workers,persistent", [(0, False), (2, False), (2, True)])
def test_iter_before_load_state_dict(workers, persistent):
    # persistent_workers changes how often torch draws from the generator (one base seed per
    # iterator): the reference and the saved run use the same setting as the resumed one.
    ref = reference(num_workers=workers, persistent_workers=persistent)
    loader = make(workers, persistent_workers=persistent)
    it = iter(loader)
    got = take(it, 5)
    sd = loader.state_dict()
    del it
    resumed = make(workers, persistent_workers=persistent)
    it = iter(resumed)  # a framework's sanity check, say, before the checkpoint is loaded
    next(it)
    resumed.load_state_dict(sd)
    got += as_lists(it)  # the iterator made before load_state_dict continues from the state
    assert got == ref[0]
    assert as_lists(resumed) == ref[1]


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_at_the_end_of_an_epoch(workers):
    ref = reference(3)
    # Saved inside the loop, after the last batch (StopIteration not seen yet): the rest of the
    # epoch is empty, then the next epoch comes whole.
    loader = make(workers)
    it = iter(loader)
    take(it, N // B)
    inside = saved(loader.state_dict())
    # Saved after the loop ended.
    for _ in it:
        pass
    after = saved(loader.state_dict())
    assert (inside["position"], inside["finished"]) == (N // B, False)
    assert (after["epoch"], after["finished"]) == (1, True)
    for sd, rest_of_epoch in ((inside, []), (after, ref[1])):
        resumed = make(workers, seed=7)
        resumed.load_state_dict(sd)
        assert as_lists(resumed) == rest_of_epoch
        assert as_lists(resumed) == (ref[1] if rest_of_epoch == [] else ref[2])


def test_prefetched_batches_are_not_lost():
    ref = reference()
    loader = make(2, prefetch_factor=4)
    it = iter(loader)
    got = take(it, 2)
    assert it.stats()["tasks"]["sent"] > 2 + 2  # batches were prefetched beyond what was yielded
    sd = loader.state_dict()
    assert sd["position"] == 2 and sd["batches_yielded"] == 2
    got += take(it, 1)  # the saved run goes on; the resumed one must give the same batch
    del it
    resumed = make(2)
    resumed.load_state_dict(sd)
    rest = as_lists(resumed)
    assert got[:2] + rest == ref[0]
    assert rest[0] == got[2]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_resume_under_each_start_method(context):
    ref = reference()
    loader = make(2, multiprocessing_context=context)
    it = iter(loader)
    got = take(it, 6)
    sd = saved(loader.state_dict())
    del it
    resumed = make(2, multiprocessing_context=context)
    resumed.load_state_dict(sd)
    assert got + as_lists(resumed) == ref[0]


@pytest.mark.parametrize("workers", [0, 2])
def test_global_rng_shuffle_resumes_and_leaves_the_callers_rng_alone(workers):
    """RandomSampler without a generator seeds itself from torch's global RNG at the first
    draw: the resume must replay that draw, and leave the global RNG as the user restored it,
    so the epochs after it are the uninterrupted run's."""
    def fresh():
        return stoker.DataLoader(Augmented(N), batch_size=B, shuffle=True, num_workers=workers,
                                 seed="per_sample")

    torch.manual_seed(5)
    loader = fresh()
    ref = [as_lists(loader), as_lists(loader)]
    torch.manual_seed(5)
    loader = fresh()
    it = iter(loader)
    got = take(it, 3)
    sd, rng = loader.state_dict(), torch.get_rng_state()  # a training checkpoint holds both
    del it
    torch.manual_seed(1234)  # a fresh process
    resumed = fresh()
    resumed.load_state_dict(sd)
    torch.set_rng_state(rng)
    got += as_lists(resumed)
    assert got == ref[0]
    assert as_lists(resumed) == ref[1]


def test_persistent_workers_resume_into_a_later_epoch():
    ref = reference(3, num_workers=2, persistent_workers=True)
    loader = make(2, persistent_workers=True)
    assert as_lists(loader) == ref[0]
    it = iter(loader)
    got = take(it, 7)
    sd = loader.state_dict()
    assert sd["epoch"] == 2
    resumed = make(0)  # the rest of the epoch, in one process
    resumed.load_state_dict(sd)
    assert got + as_lists(resumed) == ref[1]
    resumed = make(4, persistent_workers=True)  # and with persistent workers, the epoch after
    resumed.load_state_dict(sd)
    got += as_lists(resumed)
    assert got == ref[1]
    assert as_lists(resumed) == ref[2]


def test_distributed_sampler_resumes_per_rank_with_its_epoch():
    from torch.utils.data.distributed import DistributedSampler

    def rank_loader(rank, workers):
        sampler = DistributedSampler(Augmented(N), num_replicas=2, rank=rank, seed=3)
        return stoker.DataLoader(Augmented(N), batch_size=B, sampler=sampler,
                                 num_workers=workers, seed="per_sample")

    for rank in (0, 1):
        ref_loader = rank_loader(rank, 0)
        ref_loader.sampler.set_epoch(4)
        torch.manual_seed(0)
        ref = as_lists(ref_loader)
        loader = rank_loader(rank, 2)
        loader.sampler.set_epoch(4)
        torch.manual_seed(0)
        it = iter(loader)
        got = take(it, 2)
        sd = loader.state_dict()
        del it
        resumed = rank_loader(rank, 0)  # its sampler is at epoch 0: load_state_dict sets 4
        resumed.load_state_dict(sd)
        assert resumed.sampler.epoch == 4
        assert got + as_lists(resumed) == ref
        other = rank_loader(rank, 0)
        other.load_state_dict(sd)
        other.sampler.set_epoch(5)
        with pytest.raises(StateMismatchError, match=r"set_epoch\(4\)"):
            iter(other)


@pytest.mark.unit
def test_a_state_from_another_loader_is_refused_with_what_differs():
    loader = make(0)
    it = iter(loader)
    next(it)
    sd = loader.state_dict()
    other = stoker.DataLoader(Augmented(N + 1), batch_size=B * 2, shuffle=False)
    with pytest.raises(StateMismatchError) as e:
        other.load_state_dict(sd)
    msg = str(e.value)
    for what in ("batch_size: saved 4, here 8", "dataset_length: saved 40, here 41",
                 "RandomSampler", "SequentialSampler"):
        assert what in msg
    with pytest.raises(StateMismatchError, match="version"):
        loader.load_state_dict(dict(sd, version=999))


@pytest.mark.unit
def test_skipped_samples_travel_with_the_state():
    from resume_datasets import FailsAt

    loader = stoker.DataLoader(FailsAt({3, 30}), batch_size=4, on_error="skip")
    it = iter(loader)
    first = [next(it) for _ in range(2)]
    sd = loader.state_dict()
    resumed = stoker.DataLoader(FailsAt({3, 30}), batch_size=4, on_error="skip")
    resumed.load_state_dict(sd)
    assert [s.index for s in resumed.skipped] == [3]
    rest = list(resumed)
    assert sum(len(b) for b in first + rest) == 64 - 2
    assert [s.index for s in resumed.skipped] == [3, 30]


def test_dcp_saves_and_loads_the_loader_as_a_stateful(tmp_path):
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    ref = reference()
    loader = make(2)
    it = iter(loader)
    got = take(it, 4)
    with pytest.warns(UserWarning):  # "no process group: a single process" (torch's note)
        dcp.save({"loader": loader}, checkpoint_id=str(tmp_path))
    del it
    resumed = make(0)
    with pytest.warns(UserWarning):
        dcp.load({"loader": resumed}, checkpoint_id=str(tmp_path))
    assert got + as_lists(resumed) == ref[0]


@pytest.mark.unit
def test_state_before_any_iteration_round_trips():
    ref = reference()
    loader = make(0)
    sd = loader.state_dict()
    assert (sd["epoch"], sd["finished"]) == (0, True)
    resumed = make(0, seed=50)
    resumed.load_state_dict(saved(sd))  # the generator is put back where the saved loader had it
    assert as_lists(resumed) == ref[0]


def test_per_sample_seeding_is_the_same_whatever_num_workers_and_keeps_main_rng():
    torch.manual_seed(0)
    before = torch.get_rng_state()
    a = reference(num_workers=0)
    assert torch.equal(torch.get_rng_state(), before)  # loading drew nothing from the user's RNG
    assert reference(num_workers=3) == a
    loader = make(3)
    plain = stoker.DataLoader(Augmented(N), batch_size=B, shuffle=True, num_workers=3,
                              generator=torch.Generator().manual_seed(1))
    assert indices(loader) == indices(plain)  # the option changes values, not the order
    with pytest.raises(ValueError, match="per_sample"):
        stoker.DataLoader(Augmented(N), seed="each")


@pytest.mark.parametrize("workers", [0, 2])
def test_iterable_dataset_resumes_by_skipping_with_the_same_num_workers(workers):
    from resume_datasets import Stream

    def fresh(w=workers):
        return stoker.DataLoader(Stream(30), batch_size=4, num_workers=w)

    ref = [b.tolist() for b in fresh()]
    loader = fresh()
    it = iter(loader)
    got = [next(it).tolist() for _ in range(3)]
    sd = loader.state_dict()
    del it
    resumed = fresh()
    resumed.load_state_dict(sd)
    assert got + [b.tolist() for b in resumed] == ref
    with pytest.raises(StateMismatchError, match="num_workers: saved"):
        fresh(workers + 1).load_state_dict(sd)


def test_each_skipped_sample_is_recorded_once_across_a_resume_with_prefetched_batches():
    """Batches prefetched before the checkpoint and loaded again after the resume must not record
    their skipped samples a second time (9 corrupt samples, 9 records)."""
    from resume_datasets import FailsAt

    bad = {1, 5, 6, 14, 22, 23, 37, 50, 61}

    def make_skipping(workers):
        return stoker.DataLoader(FailsAt(bad), batch_size=4, on_error="skip",
                                 num_workers=workers, prefetch_factor=4 if workers else None)

    loader = make_skipping(2)
    it = iter(loader)
    first = [next(it) for _ in range(5)]
    sd = loader.state_dict()
    del it
    resumed = make_skipping(2)
    resumed.load_state_dict(saved(sd))
    rest = list(resumed)
    assert sorted(s.index for s in resumed.skipped) == sorted(bad)
    assert sum(len(b) for b in first + rest) == 64 - len(bad)


class _BadStream(torch.utils.data.IterableDataset):
    """0..39 split among workers by stride; the values in `bad` raise (corrupt records). No
    state of its own: a resume reads the stream again and drops what was delivered."""

    def __init__(self, bad):
        self.bad = set(bad)

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        k, n = (0, 1) if info is None else (info.id, info.num_workers)
        return _Records(iter(range(k, 40, n)), self.bad)


class _Records:
    """An iterator that raises for a bad record and goes on after it (a generator would end)."""

    def __init__(self, it, bad):
        self.it, self.bad = it, bad

    def __iter__(self):
        return self

    def __next__(self):
        i = next(self.it)
        if i in self.bad:
            raise ValueError(f"corrupt record {i}")
        return i


@pytest.mark.parametrize("workers", [0, 2])
def test_skips_of_a_replayed_stream_are_recorded_once(workers):
    """A stream without state is read again after a resume and the batches delivered before
    are dropped: their skipped samples were recorded before the checkpoint, not again."""
    def make_stream():
        return stoker.DataLoader(_BadStream({2, 7}), batch_size=4, on_error="skip",
                                 num_workers=workers)

    ref = make_stream()
    want = [b.tolist() for b in ref]
    loader = make_stream()
    it = iter(loader)
    got = [next(it).tolist() for _ in range(4)]
    sd = saved(loader.state_dict())
    del it
    resumed = make_stream()
    resumed.load_state_dict(sd)
    got += [b.tolist() for b in resumed]
    assert got == want
    assert len(resumed.skipped) == len(ref.skipped), (resumed.skipped, ref.skipped)
