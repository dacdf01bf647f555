"""Datasets for the checkpoint and resume tests (module level: spawn pickles them)."""

from __future__ import annotations

import random

import numpy as np
import torch
from torch.utils.data import Dataset


class Augmented(Dataset):
    """Each sample draws from random, NumPy and torch, as augmentation does: its values are
    reproducible only when its generators are seeded per sample."""

    def __init__(self, n=40):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"index": i, "torch": torch.rand(2), "numpy": np.random.rand(), "py": random.random()}


def as_lists(batches):
    """Batches of Augmented as plain comparable lists (exact float values kept)."""
    return [[b["index"].tolist(), b["torch"].tolist(), b["numpy"].tolist(), b["py"].tolist()]
            for b in batches]


def indices(batches):
    return [b["index"].tolist() for b in batches]


class FailsAt(Dataset):
    """Sample i is i, except those in `bad`, which raise (a corrupt file)."""

    def __init__(self, bad, n=64):
        self.bad = set(bad)
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i in self.bad:
            raise ValueError(f"cannot decode sample {i}: corrupt file")
        return i


class Stream(torch.utils.data.IterableDataset):
    """0..n-1, split among workers by stride (each worker iterates its own copy)."""

    def __init__(self, n=30):
        self.n = n

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        k, w = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(k, self.n, w))


class StatefulStream(torch.utils.data.IterableDataset):
    """A stream in torchdata's Stateful style: each worker reads its share (every
    num_workers-th item from its id) of `n` items. Each item is [worker, item, reads], where
    `reads` counts the items this iterator produced since it was made or restored: a resume
    that restores the state starts again at 1; one that replays the stream does not.
    `where`: "iterator" (iter() returns a stateful iterator, torchdata's nodes) or "dataset"
    (the dataset holds the position and has state_dict itself)."""

    def __init__(self, n=40, where="iterator"):
        self.n = n
        self.where = where
        self.pos = 0

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, state):
        self.pos = state["pos"]

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        if self.where == "iterator":
            return _StreamIter(range(wid, self.n, nw), wid)
        return self._gen(wid, nw)

    def _gen(self, wid, nw):
        mine = range(wid, self.n, nw)
        reads = 0
        while self.pos < len(mine):
            item = mine[self.pos]
            self.pos += 1
            reads += 1
            yield [wid, item, reads]
        self.pos = 0  # the next epoch starts over


class _StreamIter:
    def __init__(self, items, wid):
        self.items, self.wid, self.pos, self.reads = items, wid, 0, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.pos >= len(self.items):
            raise StopIteration
        self.pos += 1
        self.reads += 1
        return [self.wid, self.items[self.pos - 1], self.reads]

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, state):
        self.pos = state["pos"]


class StateFails(StatefulStream):
    """A stateful stream whose state_dict() cannot be taken (a bug in the dataset)."""

    def state_dict(self):
        raise ValueError("cannot serialise the reader's file handle")


class StreamKilledOnce(StatefulStream):
    """A stateful stream whose worker is SIGKILLed the first time it reaches item `at` (a marker
    file in `marks` says it happened: the restarted worker goes on)."""

    def __init__(self, n, at, marks, where="iterator"):
        super().__init__(n, where)
        self.at, self.marks = at, marks

    def __iter__(self):
        return _KillsOnce(super().__iter__(), self.at, self.marks)


class _KillsOnce:
    """Passes a stream's rows through, and its state_dict/load_state_dict when it has them."""

    def __init__(self, inner, at, marks):
        self.inner, self.at, self.marks = inner, at, marks
        if hasattr(inner, "state_dict"):
            self.state_dict = inner.state_dict
            self.load_state_dict = inner.load_state_dict

    def __iter__(self):
        return self

    def __next__(self):
        import os
        import signal

        row = next(self.inner)
        mark = os.path.join(self.marks, f"killed-{row[1]}")
        if row[1] == self.at and not os.path.exists(mark):
            open(mark, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return row


class UnevenStream(torch.utils.data.IterableDataset):
    """Worker 0 yields `short` items, the others `long` each (item = worker * 1000 + k): worker
    0's stream ends early in every epoch."""

    def __init__(self, short=2, long=20):
        self.short, self.long = short, long

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        wid = 0 if info is None else info.id
        return iter(range(wid * 1000, wid * 1000 + (self.short if wid == 0 else self.long)))


class NumpyPermSampler(torch.utils.data.Sampler):
    """A sampler with its own state (torchdata's Stateful protocol): each epoch is a permutation
    from its own NumPy generator, and it yields NumPy integers (as np.random.permutation
    does). Resumed without its state, an epoch gives another order."""

    def __init__(self, n, seed=0):
        self.n = n
        self.rng = np.random.default_rng(seed)

    def __len__(self):
        return self.n

    def __iter__(self):
        yield from self.rng.permutation(self.n)  # np.int64 items

    def state_dict(self):
        return {"rng": self.rng.bit_generator.state}

    def load_state_dict(self, state):
        self.rng.bit_generator.state = state["rng"]


class RandomStream(torch.utils.data.IterableDataset):
    """`n` items per worker, each [worker, k, a draw from torch's generator]: the draws are what
    seed="per_sample" makes reproducible for a stream."""

    def __init__(self, n=32):
        self.n = n

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        wid = 0 if info is None else info.id
        for k in range(self.n):
            yield torch.tensor([float(wid), float(k), torch.rand(()).item()])


class OpaqueStateStream(StatefulStream):
    """A stateful stream whose state holds an object a checkpoint cannot hold (a file handle
    wrapper, say)."""

    class Handle:
        pass

    def state_dict(self):
        return {"pos": self.pos, "reader": OpaqueStateStream.Handle()}


class MosaicLikeStream(torch.utils.data.IterableDataset):
    """A dataset with methods named state_dict/load_state_dict that mean something else (Mosaic's
    StreamingDataset.state_dict(num_samples, from_beginning)): not the Stateful protocol."""

    def __init__(self, n=12):
        self.n = n
        self.resumed_at = None

    def state_dict(self, num_samples, from_beginning):
        return {"sample_in_epoch": num_samples}

    def load_state_dict(self, obj):
        self.resumed_at = obj["sample_in_epoch"]

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        k, w = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(k, self.n, w))


# -- per-worker states (tests/loader/resume/test_worker_states.py) ---------------------------------------
def _worker():
    """(worker id, number of workers): (0, 1) in the main process."""
    info = torch.utils.data.get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


class CountedStreams(torch.utils.data.IterableDataset):
    """A stream without state where worker w yields counts[w] items (w * 100 + k): with
    counts (0, 10, 7) worker 0 has nothing, and worker 2 ends before worker 1. In the main
    process (num_workers=0) it yields counts[0] items."""

    def __init__(self, counts=(0, 10, 7)):
        self.counts = tuple(counts)

    def __iter__(self):
        wid, _ = _worker()
        return iter(range(wid * 100, wid * 100 + self.counts[wid]))


class OwnRng(Dataset):
    """A map-style dataset with its own generator (a random.Random): sample i is
    (i, a draw from it). Its state is the generator's, as plain data (ints and tuples): each
    worker's copy advances with what that worker loaded."""

    def __init__(self, n=24, seed=0):
        self.n = n
        self.rng = random.Random(seed)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i, self.rng.random()

    def state_dict(self):
        return {"rng": self.rng.getstate()}

    def load_state_dict(self, state):
        version, internal, gauss = state["rng"]  # a JSON round trip makes the tuples lists
        self.rng.setstate((version, tuple(internal), gauss))


class OwnRngKilledOnce(OwnRng):
    """OwnRng whose worker is SIGKILLed the first time it loads sample `at` (a marker file in
    `marks` says it happened: the restarted worker goes on)."""

    def __init__(self, n, at, marks, seed=0):
        super().__init__(n, seed)
        self.at, self.marks = at, marks

    def __getitem__(self, i):
        _kill_once(i, self.at, self.marks)
        return super().__getitem__(i)


class AugmentedKilledOnce(Augmented):
    """Augmented whose worker is SIGKILLed the first time it loads sample `at` (once: a marker
    file in `marks`)."""

    def __init__(self, n, at, marks):
        super().__init__(n)
        self.at, self.marks = at, marks

    def __getitem__(self, i):
        _kill_once(i, self.at, self.marks)
        return super().__getitem__(i)


def _kill_once(i, at, marks):
    import os
    import signal

    mark = os.path.join(marks, f"killed-{i}")
    if i == at and torch.utils.data.get_worker_info() is not None and not os.path.exists(mark):
        open(mark, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)


class RandomDrawStream(torch.utils.data.IterableDataset):
    """A stream without state: each worker's share of 0..n-1, each item with a draw from
    random, NumPy and torch (a float64 tensor [item, py, numpy, torch])."""

    def __init__(self, n=24):
        self.n = n

    def __iter__(self):
        wid, nw = _worker()
        for i in range(wid, self.n, nw):
            yield torch.tensor([i, random.random(), np.random.rand(), torch.rand(()).item()],
                               dtype=torch.float64)


class EpochCountingStream(torch.utils.data.IterableDataset):
    """A stream whose state counts its epochs: each __iter__ begins the next one, and its items
    say which (epoch * 1000 + item, each worker its share of 0..n-1)."""

    def __init__(self, n=12):
        self.n = n
        self.epoch = 0

    def state_dict(self):
        return {"epoch": self.epoch}

    def load_state_dict(self, state):
        self.epoch = state["epoch"]

    def __iter__(self):
        self.epoch += 1
        wid, nw = _worker()
        return iter([self.epoch * 1000 + i for i in range(wid, self.n, nw)])


class SelfIteratingStream(torch.utils.data.IterableDataset):
    """A stream that is its own iterator: __iter__ sets up its share of 0..n-1 and its position
    and returns self. Its load_state_dict checks the position against that share, which only
    __iter__ creates: the state must be loaded after iter(), not before."""

    def __init__(self, n=20):
        self.n = n

    def __iter__(self):
        wid, nw = _worker()
        self.items = list(range(wid, self.n, nw))
        self.pos = 0
        return self

    def __next__(self):
        if self.pos >= len(self.items):
            raise StopIteration
        self.pos += 1
        return self.items[self.pos - 1]

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, state):
        if not 0 <= state["pos"] <= len(self.items):
            raise ValueError(f"position {state['pos']} outside this worker's {len(self.items)}")
        self.pos = state["pos"]


class OwnTorchGenerator(Dataset):
    """A map-style dataset drawing from its own torch.Generator: its state is the generator's
    state, a tensor of 5056 bytes (plain data for torch.save, compared elementwise)."""

    def __init__(self, n=16, seed=0):
        self.n = n
        self.gen = torch.Generator().manual_seed(seed)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i, torch.rand(1, generator=self.gen).item()

    def state_dict(self):
        return {"gen": self.gen.get_state()}

    def load_state_dict(self, state):
        self.gen.set_state(state["gen"])


class GlobalRngState(Dataset):
    """Sample i is i, or a torch.randint draw with `draws`; its state is torch's global RNG
    (as some datasets make it): restoring it in the main process moves the caller's RNG."""

    def __init__(self, n=20, draws=False):
        self.n, self.draws = n, draws

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return int(torch.randint(1000, (1,)).item()) if self.draws else i

    def state_dict(self):
        return {"g": torch.get_rng_state()}

    def load_state_dict(self, state):
        torch.set_rng_state(state["g"])
