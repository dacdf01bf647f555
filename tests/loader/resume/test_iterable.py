"""Resuming an IterableDataset whose dataset or iterator is stateful (torchdata's Stateful
protocol): each worker's state travels with its batches and goes back into the same worker, so
the stream continues where it was, instead of being read again and dropped."""

from __future__ import annotations

import pytest
import torch

import stoker
from resume_datasets import StatefulStream
from stoker import StateMismatchError
from support.scenarios import run_ok

N, B = 40, 3


def make(workers, where="iterator", **kw):
    return stoker.DataLoader(StatefulStream(N, where), batch_size=B, num_workers=workers, **kw)


def rows(batch):
    """A batch as [(worker, item, reads), ...]."""
    return [tuple(r) for r in zip(*(t.tolist() for t in batch))]


def items(batches):
    return [[(w, i) for w, i, _ in rows(b)] for b in batches]


@pytest.mark.parametrize("where", ["iterator", "dataset"])
@pytest.mark.parametrize("workers,context", [(0, None), (2, "fork"), (3, "spawn")])
def test_each_worker_continues_from_its_own_state(where, workers, context):
    ref = items(make(workers, where, multiprocessing_context=context))
    loader = make(workers, where, multiprocessing_context=context, prefetch_factor=3
                  if workers else None)
    it = iter(loader)
    got = items(next(it) for _ in range(5))
    sd = loader.state_dict()
    assert sd["worker_states"], sd  # captured, one per worker that delivered a batch
    del it  # prefetched batches die with the job
    again = make(workers, where, multiprocessing_context=context)
    again.load_state_dict(sd)
    rest = list(again)
    got += items(rest)
    assert got == ref  # nothing repeated or lost, in the uninterrupted order
    # Restored, not replayed: each worker's first item after the resume is its first read.
    first_reads = {}
    for w, _, reads in (r for b in rest for r in rows(b)):
        first_reads.setdefault(w, reads)
    assert set(first_reads.values()) == {1}, first_reads
    assert items(again) == ref  # the next epoch starts over


def test_persistent_workers_take_the_loaded_state_with_the_new_epoch():
    ref = items(make(2))
    loader = make(2)
    it = iter(loader)
    got = items(next(it) for _ in range(4))
    sd = loader.state_dict()
    del it
    live = make(2, persistent_workers=True)
    assert len(list(live)) == len(ref)  # its workers are running, at the end of their streams
    live.load_state_dict(sd)
    assert got + items(live) == ref


def test_another_num_workers_is_refused_and_says_why():
    loader = make(2)
    it = iter(loader)
    next(it)
    sd = loader.state_dict()
    with pytest.raises(StateMismatchError, match="its own state"):
        make(3).load_state_dict(sd)


def test_a_state_dict_that_fails_is_named_with_what_to_do():
    from resume_datasets import StateFails

    loader = stoker.DataLoader(StateFails(N, "dataset"), batch_size=B, num_workers=2)
    with pytest.raises(Exception, match=r"state_dict\(\) failed in worker 0 \(ValueError: "
                                        r"cannot serialise") as e:
        next(iter(loader))
    assert "remove state_dict" in str(e.value)


def test_a_hugging_face_streaming_dataset_resumes_from_its_own_state():
    datasets = pytest.importorskip("datasets", reason="datasets not installed (make test "
                                   "installs it from tests/requirements-frameworks.txt)")
    stream = datasets.Dataset.from_dict({"i": list(range(N))}).to_iterable_dataset(num_shards=4)

    def make_hf():
        return stoker.DataLoader(stream, batch_size=B, num_workers=2)

    ref = [b["i"].tolist() for b in make_hf()]
    loader = make_hf()
    it = iter(loader)
    got = [next(it)["i"].tolist() for _ in range(3)]
    sd = loader.state_dict()
    assert len(sd["worker_states"]) == 2  # datasets' own state_dict, one per worker
    del it
    again = make_hf()
    again.load_state_dict(sd)
    assert got + [b["i"].tolist() for b in again] == ref


@pytest.mark.parametrize("where", ["iterator", "dataset"])
def test_a_killed_worker_of_a_stateful_stream_restarts_from_its_state(tmp_path, where):
    from resume_datasets import StreamKilledOnce

    ref = items(make(2, where))
    loader = stoker.DataLoader(StreamKilledOnce(N, 21, str(tmp_path), where), batch_size=B,
                               num_workers=2)
    got = items(loader)  # worker 1 dies in its 4th batch, after sending 3
    assert (tmp_path / "killed-21").exists()
    assert got == ref  # its replacement continued from its state: nothing repeated or lost
    assert len(loader.deaths) == 1


@pytest.mark.parametrize("persistent", [False, True])
def test_load_state_dict_after_a_workers_stream_ended_starts_that_worker_again(
        persistent):
    """Worker 0's stream ends early; load_state_dict on the live iterator starts over from the
    loaded state: worker 0 (stopped, non-persistent) is started again, nothing waits on it."""
    run_ok("resume_iterable.load_state_after_a_stream_ended", persistent, timeout=60)


@pytest.mark.parametrize("workers", [0, 2])
def test_per_sample_seeding_gives_a_stream_distinct_draws_the_same_every_run(workers):
    """seed="per_sample" on an IterableDataset: each sample is keyed by its worker and its place
    in that worker's stream, so 64 samples get 64 draws (not one per batch), and a second run
    gives the same values."""
    from resume_datasets import RandomStream

    def run():
        torch.manual_seed(0)
        loader = stoker.DataLoader(RandomStream(32), batch_size=4, num_workers=workers,
                                   seed="per_sample")
        return torch.cat(list(loader))

    first, again = run(), run()
    draws = first[:, 2]
    assert len(first) == 32 * max(1, workers)
    assert len(set(draws.tolist())) == len(draws)
    assert torch.equal(first, again)


def test_per_sample_seeding_of_a_stateful_stream_resumes_bit_identical():
    from resume_datasets import StatefulStream

    class Drawing(StatefulStream):
        def __iter__(self):
            for row in super().__iter__():
                yield row[:2] + [torch.rand(()).item()]

    def make():
        return stoker.DataLoader(Drawing(24, where="dataset"), batch_size=3, num_workers=2,
                                 seed="per_sample", generator=torch.Generator().manual_seed(4))

    ref = [b[2].tolist() for b in make()]
    loader = make()
    it = iter(loader)
    head = [next(it)[2].tolist() for _ in range(3)]
    sd = loader.state_dict()
    del it
    resumed = make()
    resumed.load_state_dict(sd)
    assert head + [b[2].tolist() for b in resumed] == ref


@pytest.mark.parametrize("workers", [0, 2])
def test_methods_named_state_dict_with_other_arguments_are_not_the_stateful_protocol(workers):
    """Mosaic's StreamingDataset has state_dict(num_samples, from_beginning): it runs as torch
    runs it (stoker takes no state), and resumes replay the stream."""
    from resume_datasets import MosaicLikeStream

    loader = stoker.DataLoader(MosaicLikeStream(12), batch_size=2, num_workers=workers)
    assert sorted(i for b in loader for i in b.tolist()) == list(range(12))
    it = iter(loader)
    next(it)
    sd = loader.state_dict()
    assert not [s for _, s in sd["worker_states"] if {"dataset", "iterator", "self"} & set(s)]
    del it
    resumed = stoker.DataLoader(MosaicLikeStream(12), batch_size=2, num_workers=workers)
    resumed.load_state_dict(sd)
    assert len([i for b in resumed for i in b.tolist()]) == 12 - 2
