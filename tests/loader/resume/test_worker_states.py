"""Resuming what lives in the workers, as torchdata's StatefulDataLoader resumes it: a stream's
uneven shares, a map-style dataset's own state (each worker's copy), the generators torch seeds
each worker with, a stream that counts its epochs or is its own iterator. Each test runs the
loader uninterrupted for the reference, then interrupts a run after k batches, builds a new
loader (a new dataset object) from the state and iterates the rest: the two parts together
must be the reference exactly (same items and values, same order, nothing repeated or lost)."""

from __future__ import annotations

import io
import json
import random

import numpy as np
import pytest
import torch

import stoker
from resume_datasets import (
    Augmented,
    AugmentedKilledOnce,
    CountedStreams,
    EpochCountingStream,
    OwnRng,
    OwnRngKilledOnce,
    RandomDrawStream,
    SelfIteratingStream,
    StatefulStream,
    as_lists,
)
from stoker import StateMismatchError

FORK = {"multiprocessing_context": "fork"}


def loader_of(dataset, workers, **kw):
    if workers:
        kw = {**FORK, **kw}
    return stoker.DataLoader(dataset, num_workers=workers, **kw)


def interrupted(make, k, convert, keep=lambda sd: sd):
    """A run interrupted after `k` batches: those from one loader, then the rest of the epoch
    from a new loader that loaded its state (through `keep`: a checkpoint file, say). Returns
    (the batches, each through `convert`; the resumed loader)."""
    loader = make()
    it = iter(loader)
    head = [convert(next(it)) for _ in range(k)]
    sd = keep(loader.state_dict())
    del it, loader  # prefetched batches die with the job
    again = make()
    again.load_state_dict(sd)
    return head + [convert(b) for b in again], again


def plain(batch):
    return batch.tolist()


def rows(batch):
    """A batch of list items (collated as one tensor per column) as [[...], ...]."""
    return [list(r) for r in zip(*(t.tolist() for t in batch))]


def worker_items(batch):
    """A StatefulStream batch as [[worker, item], ...] (its reads column counts since the
    iterator was made or restored, so it differs after a resume by design)."""
    return [r[:2] for r in rows(batch)]


def pairs(batch):
    """An OwnRng batch as [(index, draw), ...] (the draws' exact float values)."""
    index, draw = batch
    return list(zip(index.tolist(), draw.tolist()))


def as_json(sd):
    return json.loads(json.dumps(sd))


def saved(sd):
    """What a checkpoint file gives back under torch.load(weights_only=True)."""
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


# -- 1. a stream without state, its workers' shares uneven ---------------------------------------
UNEVEN_POINTS = [(1, 0), (1, 5), (1, 15), (1, 16), (2, 0), (2, 3), (2, 8)]


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("batch_size,k", UNEVEN_POINTS)
def test_uneven_stateless_streams_resume_exactly_once(batch_size, k, persistent):
    """Worker 0 yields nothing, worker 1 ten items, worker 2 seven: interrupted after k batches
    (at the start, mid-way, after worker 2's stream ended: batch 15 or 16 of 17 with
    batch_size=1, 8 of 9 with 2), the rest of the epoch comes once, in the uninterrupted order,
    and so does the next epoch. (k=0 already worked.)"""
    def make():
        return loader_of(CountedStreams((0, 10, 7)), 3, batch_size=batch_size,
                         persistent_workers=persistent)

    ref = [plain(b) for b in make()]
    assert sum(len(b) for b in ref) == 17
    got, again = interrupted(make, k, plain)
    assert got == ref
    assert [plain(b) for b in again] == ref


@pytest.mark.unit
@pytest.mark.parametrize("k", [0, 2, 4])
def test_a_single_process_stream_resumes_exactly_once(k):
    """num_workers=0, a stream of 9 items in batches of 2: the rest after k batches comes once.
    (A guard: this already worked.)"""
    def make():
        return loader_of(CountedStreams((9,)), 0, batch_size=2)

    ref = [plain(b) for b in make()]
    got, again = interrupted(make, k, plain)
    assert got == ref
    assert [plain(b) for b in again] == ref


# -- 2. a map-style dataset with its own state ---------------------------------------------------
def own_rng(workers, seed=0, **kw):
    return loader_of(OwnRng(24, seed), workers, batch_size=3, **kw)


@pytest.mark.parametrize("workers,k,persistent", [(0, 3, False), (2, 0, False), (2, 1, False),
                                                  (2, 3, False), (2, 6, False), (2, 3, True)])
def test_a_datasets_own_rng_resumes_in_each_worker(workers, k, persistent):
    """A map-style dataset with state_dict/load_state_dict keeps its own generator; each
    worker's copy advances with what that worker loaded. Resumed with the same num_workers, the
    rest of the epoch has the uninterrupted run's draws (each worker gets its own state back
    and the batches it would have loaded), and so has the epoch after it. (k=0 without
    persistent workers already worked.)"""
    def make():
        return own_rng(workers, persistent_workers=persistent)

    loader = make()
    ref = [[pairs(b) for b in loader] for _ in range(2)]
    got, again = interrupted(make, k, pairs)
    assert got == ref[0]
    assert [pairs(b) for b in again] == ref[1]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_datasets_own_state_comes_from_the_checkpoint(workers):
    """The resumed process builds its dataset with another seed: the state in the checkpoint,
    not the new dataset's, decides the draws of the rest of the epoch."""
    ref = [pairs(b) for b in own_rng(workers, seed=0)]
    loader = own_rng(workers, seed=0)
    it = iter(loader)
    got = [pairs(next(it)) for _ in range(4)]  # both workers delivered
    sd = loader.state_dict()
    del it, loader
    again = own_rng(workers, seed=12345)
    again.load_state_dict(sd)
    assert got + [pairs(b) for b in again] == ref


@pytest.mark.parametrize("when", ["before any batch", "after the epoch"])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_datasets_own_state_saved_between_epochs_gives_the_next_epoch(workers, when):
    """A state taken before the first iter(), or after the loop ended, resumes with the epoch
    the uninterrupted run has next (with num_workers=0 the dataset's generator goes on from
    where the first epoch left it; with workers each epoch starts from the main process's copy,
    as in torch). The "before any batch" cases already worked (guards); "after the epoch" with
    num_workers=2 too."""
    loader = own_rng(workers)
    ref = [[pairs(b) for b in loader] for _ in range(2)]
    loader = own_rng(workers)
    if when == "after the epoch":
        assert [pairs(b) for b in loader] == ref[0]
        want = ref[1]
    else:
        want = ref[0]
    sd = loader.state_dict()
    del loader
    again = own_rng(workers)
    again.load_state_dict(sd)
    assert [pairs(b) for b in again] == want


# -- 3. default seeding: the generators torch seeds each worker with -----------------------------
def augmented(workers, **kw):
    return loader_of(Augmented(24), workers, batch_size=3, shuffle=True,
                     generator=torch.Generator().manual_seed(0), **kw)


def seed_globals(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def global_rngs():
    return random.getstate(), np.random.get_state(), torch.get_rng_state()


def set_global_rngs(states):
    py, npy, pt = states
    random.setstate(py)
    np.random.set_state(npy)
    torch.set_rng_state(pt)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_default_seeding_resumes_bit_identical_with_workers(k):
    """No seed= option: each worker's random, NumPy and torch generators are torch's (base seed
    + worker id) and advance with what that worker loaded. Resumed with num_workers=2, the
    rest of the epoch has the uninterrupted run's values bit for bit."""
    ref = as_lists(augmented(2))
    got, _ = interrupted(lambda: augmented(2), k, lambda b: as_lists([b])[0])
    assert got == ref


@pytest.mark.unit
def test_default_seeding_in_one_process_draws_from_the_callers_generators():
    """num_workers=0 draws from the process's own generators: a checkpoint that restores them
    (as frameworks do) with the loader's state resumes bit for bit. (A guard: this already
    worked.)"""
    seed_globals(3)
    ref = as_lists(augmented(0))
    seed_globals(3)
    loader = augmented(0)
    it = iter(loader)
    got = as_lists(next(it) for _ in range(3))
    sd, rngs = loader.state_dict(), global_rngs()
    del it, loader
    seed_globals(99)  # a fresh process
    again = augmented(0)
    again.load_state_dict(sd)
    set_global_rngs(rngs)
    assert got + as_lists(again) == ref


@pytest.mark.parametrize("k", [0, 2, 5])
def test_a_random_stream_without_state_resumes_bit_identical(k):
    """A stream without state drawing from random, NumPy and torch in two workers: the resumed
    rest of the epoch has the uninterrupted run's values. (A guard: a replayed stream already
    gave them.)"""
    def make():
        return loader_of(RandomDrawStream(24), 2, batch_size=3,
                         generator=torch.Generator().manual_seed(1))

    ref = [plain(b) for b in make()]
    got, _ = interrupted(make, k, plain)
    assert got == ref


# -- 4. a stream whose state counts its epochs ----------------------------------------------------
@pytest.mark.parametrize("workers,persistent", [(0, False), (2, False), (2, True)])
def test_a_stream_counting_its_epochs_resumes_into_the_next_epoch(workers, persistent):
    """A stream's state holds its epoch (each __iter__ begins the next one). Saved after the
    first epoch's loop ended, the new loader's next epoch is the uninterrupted run's second:
    the counter goes on with num_workers=0 and persistent workers; non-persistent workers
    start each epoch from the main process's copy, as in torch (that case already worked: a
    guard)."""
    def make():
        return loader_of(EpochCountingStream(12), workers, batch_size=2,
                         persistent_workers=persistent)

    loader = make()
    ref = [sorted(i for b in loader for i in b.tolist()) for _ in range(2)]
    loader = make()
    first = sorted(i for b in loader for i in b.tolist())
    assert first == ref[0] == [1000 + i for i in range(12)]
    sd = loader.state_dict()
    del loader
    again = make()
    again.load_state_dict(sd)
    assert sorted(i for b in again for i in b.tolist()) == ref[1]


# -- 5. a stream that is its own iterator --------------------------------------------------------
@pytest.mark.parametrize("workers,k", [(0, 3), (2, 1), (2, 4)])
def test_a_stream_that_is_its_own_iterator_resumes_mid_epoch(workers, k):
    """__iter__ returns the dataset itself (setting up its position), and its load_state_dict
    needs what __iter__ set up: each worker's state goes back after iter(), so the rest of the
    epoch comes, not the epoch again from its start, and no AttributeError."""
    def make():
        return loader_of(SelfIteratingStream(20), workers, batch_size=3)

    ref = [plain(b) for b in make()]
    got, again = interrupted(make, k, plain)
    assert got == ref
    assert [plain(b) for b in again] == ref  # and the next epoch whole


# -- 6. checkpoints as JSON, and torch.save ------------------------------------------------------
def json_cases():
    return {
        "map-style shuffled, workers": (lambda: augmented(2), lambda b: as_lists([b])[0], 4),
        "stateful stream": (lambda: loader_of(StatefulStream(24, "iterator"), 2, batch_size=3),
                            worker_items, 3),
        "own rng, workers": (lambda: own_rng(2), pairs, 3),
        "own rng, one process": (lambda: own_rng(0), pairs, 3),
    }


@pytest.mark.parametrize("case", list(json_cases()))
def test_a_json_checkpoint_resumes_exactly(case):
    """json.loads(json.dumps(loader.state_dict())) is a state: loaded into a new loader, the
    rest of the epoch is the uninterrupted run's, values included."""
    make, convert, k = json_cases()[case]
    ref = [convert(b) for b in make()]
    got, _ = interrupted(make, k, convert, keep=as_json)
    assert got == ref


@pytest.mark.parametrize("workers", [0, 2])
def test_a_torch_saved_checkpoint_with_a_datasets_state_loads_weights_only(workers):
    """torch.save of a state holding a dataset's own state, loaded with weights_only=True,
    resumes exactly."""
    ref = [pairs(b) for b in own_rng(workers)]
    got, _ = interrupted(lambda: own_rng(workers), 3, pairs, keep=saved)
    assert got == ref


def _long_int_list(obj):
    """The first list of 600 or more ints in a JSON document (a random.Random state), or None."""
    if isinstance(obj, list) and len(obj) >= 600 and all(type(x) is int for x in obj):
        return obj
    children = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, list) else ()
    for child in children:
        found = _long_int_list(child)
        if found is not None:
            return found
    return None


def _edit_position(sd):
    sd["position"] += 1


def _edit_a_workers_dataset_state(sd):
    rng = _long_int_list(sd)
    assert rng is not None, "the dataset's own state is not in the JSON state as plain lists"
    rng[0] ^= 1


@pytest.mark.parametrize("edit", [_edit_position, _edit_a_workers_dataset_state],
                         ids=["position", "a worker's dataset state"])
def test_an_edited_json_checkpoint_is_refused(edit):
    """A JSON state with one value changed (where the epoch is, or a number inside a worker's
    dataset state) is refused with StateMismatchError, the loader left as it was: it still
    gives the whole epoch."""
    loader = own_rng(2)
    it = iter(loader)
    for _ in range(3):
        next(it)
    sd = as_json(loader.state_dict())
    del it, loader
    edit(sd)
    again = own_rng(2)
    with pytest.raises(StateMismatchError):
        again.load_state_dict(sd)
    assert [pairs(b) for b in again] == [pairs(b) for b in own_rng(2)]


# -- 7. load_state_dict while persistent workers are alive ---------------------------------------
@pytest.mark.parametrize("workers", [0, 2])
def test_a_datasets_state_holding_a_tensor_resumes_through_torch_save(workers):
    """A dataset whose state is its torch.Generator's (a tensor) resumes exactly through
    torch.save/torch.load(weights_only=True): states holding tensors are sent and compared
    as such."""
    from resume_datasets import OwnTorchGenerator

    def make():
        return loader_of(OwnTorchGenerator(16), workers, batch_size=2)

    ref = [rows(b) for b in make()]
    got, _ = interrupted(make, 3, rows, saved)
    assert got == ref


def test_load_state_dict_into_live_persistent_workers_resumes_their_state():
    """Persistent workers whose dataset copies have advanced (an iterator is alive, mid-epoch):
    load_state_dict, then a new iter(), gives the saved run's rest of the epoch with its
    draws: each live worker takes its saved state."""
    ref = [pairs(b) for b in own_rng(2, persistent_workers=True)]
    loader = own_rng(2, persistent_workers=True)
    it = iter(loader)
    head = [pairs(next(it)) for _ in range(3)]
    sd = loader.state_dict()
    del it, loader
    live = own_rng(2, persistent_workers=True)
    it = iter(live)
    for _ in range(5):  # its workers' generators move on
        next(it)
    live.load_state_dict(sd)
    assert head + [pairs(b) for b in iter(live)] == ref


# -- 8. a worker restarted after its death -------------------------------------------------------
@pytest.mark.parametrize("kind", ["default seeding", "own rng"])
def test_a_restarted_worker_gives_the_uninterrupted_values(tmp_path, kind):
    """A worker SIGKILLed mid-epoch (on_worker_death="restart", the default) is replaced and
    its batches re-issued: the values are the uninterrupted run's (the replacement takes the
    generators, or the dataset's state, that came with the dead worker's last batch)."""
    if kind == "default seeding":
        def make(ds):
            return loader_of(ds, 2, batch_size=3, shuffle=True,
                             generator=torch.Generator().manual_seed(0))
        ref = as_lists(make(Augmented(24)))
        loader = make(AugmentedKilledOnce(24, 13, str(tmp_path)))
        got = as_lists(loader)
    else:
        def make(ds):
            return loader_of(ds, 2, batch_size=3)
        ref = [pairs(b) for b in make(OwnRng(24))]
        loader = make(OwnRngKilledOnce(24, 13, str(tmp_path)))
        got = [pairs(b) for b in loader]
    assert (tmp_path / "killed-13").exists()
    assert len(loader.deaths) == 1
    assert got == ref


# -- between epochs, without a generator: torch's global RNG draws the next epoch ----------------
def global_shuffle(workers, persistent=False, draws=False):
    from resume_datasets import GlobalRngState

    return stoker.DataLoader(GlobalRngState(20, draws), batch_size=2, shuffle=True,
                             num_workers=workers, persistent_workers=persistent)


@pytest.mark.parametrize("workers,persistent", [(0, False), (2, False), (2, True)])
def test_a_state_saved_between_epochs_gives_the_next_shuffle_without_a_generator(workers,
                                                                                  persistent):
    """shuffle=True without a generator draws each epoch's order (and base seed) from torch's
    global RNG: a state saved after an epoch resumes the next one as the uninterrupted run
    had it, though this process's RNG moved on meanwhile, and leaves that RNG alone."""
    torch.manual_seed(0)
    first = global_shuffle(workers, persistent)
    list(first)
    sd = first.state_dict()
    ref = [plain(b) for b in first]  # the uninterrupted run's second epoch
    mine = torch.get_rng_state()
    again = global_shuffle(workers, persistent)
    again.load_state_dict(sd)
    assert [plain(b) for b in again] == ref
    assert torch.equal(torch.get_rng_state(), mine)


def test_a_state_taken_before_the_first_iter_gives_that_iteration():
    """state_dict() before iter(): loading it later (after other batches moved torch's RNG)
    gives the batches, worker seeds included, of the iteration that followed it."""
    torch.manual_seed(0)
    first = global_shuffle(2, draws=True)
    sd = first.state_dict()
    ref = [plain(b) for b in first]
    again = global_shuffle(2, draws=True)
    it = iter(again)
    for _ in range(3):
        next(it)
    again.load_state_dict(sd)
    assert again.state_dict() == sd
    assert [plain(b) for b in again] == ref


@pytest.mark.unit
def test_a_datasets_state_that_is_the_global_rng_resumes_later_epochs_in_one_process():
    """num_workers=0, a dataset whose state is torch's global RNG, shuffle from that RNG: two
    epochs, a state, two more from a new loader are the uninterrupted run's four (the
    dataset's state goes back before the next epoch draws, as it was then)."""
    torch.manual_seed(0)
    first = global_shuffle(0)
    got = [plain(b) for _ in range(2) for b in first]
    sd = first.state_dict()
    again = global_shuffle(0)
    again.load_state_dict(sd)
    got += [plain(b) for _ in range(2) for b in again]
    torch.manual_seed(0)
    ref_loader = global_shuffle(0)
    assert got == [plain(b) for _ in range(4) for b in ref_loader]
