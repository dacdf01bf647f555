"""Each sample's __getitem__ runs once an epoch, and never more than the width at once, in real
workers under threads_per_worker (a number, "auto", and unset for an async dataset), for a
dataset that computes and one that waits. Every call is written to a journal file (one short
O_APPEND write a call: whole lines, whichever process or thread writes); each worker's most at
once rides with its samples."""

from __future__ import annotations

import asyncio
import collections
import os
import tempfile
import threading
import time

import torch
from torch.utils.data import Dataset

import stoker


class Journaled(Dataset):
    """Sample i: (i, the most samples that loaded at once in this worker so far). `work`:
    "cpu" spins `ms` of CPU, "wait" sleeps `ms`."""

    def __init__(self, journal: str, n: int, work: str, ms: float):
        self.journal, self.n, self.work, self.ms = journal, n, work, ms
        self._lock = threading.Lock()
        self._now = self._most = 0
        self._fd = None
        self._pid = None

    def __getstate__(self):
        return {"journal": self.journal, "n": self.n, "work": self.work, "ms": self.ms}

    def __setstate__(self, d):
        self.__init__(**d)

    def __len__(self):
        return self.n

    def _enter(self, i) -> None:
        with self._lock:
            if self._pid != os.getpid():  # (a forked copy opens its own)
                self._fd, self._pid = os.open(self.journal, os.O_WRONLY | os.O_APPEND), os.getpid()
                self._now = self._most = 0
            os.write(self._fd, f"{i}\n".encode())
            self._now += 1
            self._most = max(self._most, self._now)

    def _leave(self) -> int:
        with self._lock:
            self._now -= 1
            return self._most

    def __getitem__(self, i):
        self._enter(i)
        try:
            if self.work == "cpu":
                end = time.thread_time() + self.ms / 1000
                x = 0
                while time.thread_time() < end:
                    x += 1
            else:
                time.sleep(self.ms / 1000)
        finally:
            most = self._leave()
        return torch.tensor(i), torch.tensor(most)


class AsyncJournaled(Journaled):
    async def __getitem__(self, i):
        self._enter(i)
        try:
            await asyncio.sleep(self.ms / 1000)
        finally:
            most = self._leave()
        return torch.tensor(i), torch.tensor(most)


class VaryingBatches(torch.utils.data.Sampler):
    """Batches of the sizes given, in turn, over a shuffled order."""

    def __init__(self, n: int, sizes, seed: int = 0):
        self.n, self.sizes, self.seed = n, list(sizes), seed

    def __iter__(self):
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed))
        k = pos = 0
        while pos < self.n:
            size = self.sizes[k % len(self.sizes)]
            yield order[pos:pos + size].tolist()
            pos += size
            k += 1

    def __len__(self):
        k = pos = 0
        while pos < self.n:
            pos += self.sizes[k % len(self.sizes)]
            k += 1
        return k


def each_sample_once(threads, work="cpu", ms=3.0, n=1024, epochs=1, is_async=False,
                     sizes=(8, 16, 16, 32), workers=2, at_least=1):
    """Every index delivered once and loaded once each epoch; no worker ever had more than the
    width at once (a number: it; "auto", or unset for an async dataset: the widest "auto" may
    go, its first width or the largest batch); at least `at_least` at once in some worker."""
    fd, journal = tempfile.mkstemp(prefix="stoker-journal-")
    os.close(fd)
    try:
        ds = (AsyncJournaled if is_async else Journaled)(journal, n, work, ms)
        kwargs = {} if threads is None else {"threads_per_worker": threads}
        dl = stoker.DataLoader(ds, batch_sampler=VaryingBatches(n, sizes), num_workers=workers,
                               **kwargs)
        most = 0
        for epoch in range(epochs):
            with open(journal, "w"):
                pass  # (each epoch's calls alone)
            got = []
            for idx, at_once in dl:
                got += idx.tolist()
                most = max(most, int(at_once.max()))
            assert sorted(got) == list(range(n)), f"epoch {epoch}: delivered {len(got)}"
            with open(journal) as f:
                calls = collections.Counter(int(line) for line in f)
            twice = {i: c for i, c in calls.items() if c > 1}
            assert not twice, f"epoch {epoch}: loaded more than once: {sorted(twice.items())[:20]}"
            assert set(calls) == set(range(n)), f"epoch {epoch}: {n - len(calls)} never loaded"
        bound = threads if isinstance(threads, int) else max(8, *sizes)
        assert at_least <= most <= bound, (most, at_least, bound)
        if isinstance(threads, int):
            print(f"most at once {most} of {threads}")
        else:
            print(f"most at once {most}")
    finally:
        os.unlink(journal)
