"""Datasets that fail on purpose, importable by worker processes under any start method."""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time

import numpy as np
import torch
from torch.utils.data import Dataset


class Squares(Dataset):
    """Sample i: a float tensor filled with i, and i as an int label."""

    def __init__(self, n=64, shape=(4,)):
        self.n = n
        self.shape = shape

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.full(self.shape, float(i)), i


class RaisesAt(Squares):
    def __init__(self, bad, exc=ValueError, n=64):
        super().__init__(n)
        self.bad = bad
        self.exc = exc

    def __getitem__(self, i):
        if i == self.bad:
            raise self.exc(f"cannot decode sample {i}: corrupt file")
        return super().__getitem__(i)


class RaggedAt(Squares):
    """Sample `bad` has a different image shape."""

    def __init__(self, bad, n=64):
        super().__init__(n)
        self.bad = bad

    def __getitem__(self, i):
        h = 5 if i == self.bad else 4
        return {"image": torch.zeros(3, h, 4), "label": i}


class KillsSelfAt(Squares):
    def __init__(self, bad, signum=signal.SIGKILL, n=64):
        super().__init__(n)
        self.bad = bad
        self.signum = signum

    def __getitem__(self, i):
        if i == self.bad:
            if self.signum == signal.SIGSEGV:
                ctypes.string_at(0)  # a real segfault, as a buggy C extension would cause
            os.kill(os.getpid(), self.signum)
            time.sleep(5)
        return super().__getitem__(i)


class ExitsAt(Squares):
    def __init__(self, bad, code=3, n=64):
        super().__init__(n)
        self.bad = bad
        self.code = code

    def __getitem__(self, i):
        if i == self.bad:
            os._exit(self.code)
        return super().__getitem__(i)


class Unpicklable:
    def __init__(self):
        self.lock = threading.Lock()


def collate_with_lock(batch):
    return {"x": torch.stack([b[0] for b in batch]), "handle": Unpicklable()}


class Big(Dataset):
    """Samples of `mb` megabytes each, filled with their index."""

    def __init__(self, n=4, mb=64):
        self.n = n
        self.numel = mb * 1024 * 1024 // 4

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.full((self.numel,), float(i))


class NumpyOnly(Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        return np.full((2, 2), i, dtype=np.int32)


class KillsOnceAt(Squares):
    """Kills its own worker (SIGKILL) the first time each index in `bad` is loaded; a marker
    file in `marks` remembers, across worker restarts, that it already happened."""

    def __init__(self, bad, marks, n=64, signum=signal.SIGKILL):
        super().__init__(n)
        self.bad = set(bad)
        self.marks = marks
        self.signum = signum

    def __getitem__(self, i):
        if i in self.bad:
            mark = os.path.join(self.marks, str(i))
            if not os.path.exists(mark):
                open(mark, "w").close()
                os.kill(os.getpid(), self.signum)
                time.sleep(5)
        return super().__getitem__(i)


class HangsAt(Squares):
    """Sample `bad` never returns (a stuck network read)."""

    def __init__(self, bad, n=64):
        super().__init__(n)
        self.bad = bad

    def __getitem__(self, i):
        if i == self.bad:
            self._wait_forever()
        return super().__getitem__(i)

    def _wait_forever(self):
        while True:
            time.sleep(0.05)


class FlakyAt(Squares):
    """Raises IOError the first `times` times sample `bad` is loaded (a transient read error)."""

    def __init__(self, bad, marks, times=1, n=64):
        super().__init__(n)
        self.bad = bad
        self.marks = marks
        self.times = times

    def __getitem__(self, i):
        if i == self.bad:
            mark = os.path.join(self.marks, f"flaky-{i}")
            count = int(open(mark).read()) if os.path.exists(mark) else 0
            if count < self.times:
                with open(mark, "w") as f:
                    f.write(str(count + 1))
                raise OSError(f"transient read error on sample {i}")
        return super().__getitem__(i)


class Hog(Squares):
    """Sample `bad` allocates and touches `mb` megabytes (an image that decodes to a giant)."""

    def __init__(self, bad, mb, n=64):
        super().__init__(n)
        self.bad = bad
        self.mb = mb

    def __getitem__(self, i):
        if i == self.bad:
            blob = bytearray(self.mb * 2**20)
            blob[:: 4096] = b"x" * len(blob[:: 4096])
            time.sleep(5)
        return super().__getitem__(i)


class Slow(Squares):
    def __getitem__(self, i):
        time.sleep(0.02)
        return super().__getitem__(i)


class Lookup(Dataset):
    """Reads a stoker.SharedList; each sample also says whether the worker maps its memfd."""

    def __init__(self):
        import stoker

        self.items = stoker.SharedList({"k": i, "s": str(i)} for i in range(10000))

    def __len__(self):
        return 100

    def __getitem__(self, i):
        maps = open("/proc/self/maps").read()
        return self.items[i * 97]["k"], ("stoker-sharedlist" in maps)


class NegatedViews(Dataset):
    """Real tensors whose memory is not their values: x.conj().imag carries a negative bit."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        z = torch.tensor([1 + 2j, 3 + 4j + i])
        return z.conj().imag, z.conj()


class RaisesInStream(torch.utils.data.IterableDataset):
    """A generator that fails at its 4th element."""

    def __iter__(self):
        for i in range(10):
            if i == 3:
                raise ValueError("stream broke at element 3")
            yield torch.tensor([i])


class RewritesReadySlots(Squares):
    """From sample `at` on, bumps the generation of every slot of its worker that holds a batch
    waiting in the main process: what a C extension scribbling over shared memory would do."""

    def __init__(self, at, n=64):
        super().__init__(n)
        self.at = at

    def __getitem__(self, i):
        if i >= self.at:
            for line in open("/proc/self/maps"):
                if "-slot" in line and "stoker-w" in line:
                    start = int(line.split("-", 1)[0], 16)
                    words = (ctypes.c_uint32 * 3).from_address(start)
                    if words[1] == 2:  # READY
                        words[2] += 1  # the generation
        return super().__getitem__(i)


class Keyed(Dataset):
    """Samples named by str keys ("k0", "k1", ...); loading `bad` kills the worker (SIGSEGV)."""

    def __init__(self, bad, n=32):
        self.bad = bad
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, key):
        if key == self.bad:
            ctypes.string_at(0)
        return torch.full((4,), float(key[1:])), int(key[1:])


class KillsInCollateOnce:
    """A collate_fn that SIGKILLs its worker the first time a batch holds the sample `at` (a
    marker file in `marks` remembers it happened): the worker has already reported the
    batch's skipped samples when it dies."""

    def __init__(self, at, marks):
        self.at, self.marks = at, marks

    def __call__(self, batch):
        mark = os.path.join(self.marks, f"collate-{self.at}")
        if self.at in batch and not os.path.exists(mark):
            open(mark, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(5)
        return torch.utils.data.default_collate(batch)


class Wide(Dataset):
    """Sample i: `width` floats of the value i (a view into the slot when large) and the label i
    (a small leaf, copied out). `die_at`: that index SIGKILLs its worker once (a marker file
    remembers); `bad`: that index raises."""

    def __init__(self, n, width, die_at=None, marker=None, bad=None):
        self.n, self.width, self.die_at, self.marker, self.bad = n, width, die_at, marker, bad

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.die_at and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        if i == self.bad:
            raise ValueError(f"cannot decode sample {i}")
        return {"x": torch.full((self.width,), float(i)), "y": i}


class Arrays(Dataset):
    """`mb` MiB of NumPy arrays held in memory (what spawn must not copy into every worker).
    Each sample: the first values of its array, whether the worker may write to it, and the
    worker's pid. `write`: a sample also writes into its array (it stays the worker's own).
    Counts, in a file of `marks`, how many times the main process pickled it."""

    def __init__(self, mb=64, n=64, marks=None, write=False):
        rng = np.random.default_rng(0)
        self.arrays = [rng.integers(0, 1000, mb * 2**20 // n // 8) for _ in range(n)]
        self.marks = marks
        self.write = write

    def __getstate__(self):
        if self.marks is not None:
            with open(os.path.join(self.marks, "pickled"), "a") as f:
                f.write(f"{os.getpid()}\n")
        return self.__dict__

    def __len__(self):
        return len(self.arrays)

    def __getitem__(self, i):
        a = self.arrays[i]
        if self.write:
            a[1] = -1
        return torch.from_numpy(a[:4].copy()), a.flags.writeable, os.getpid()


class Reports(Dataset):
    """Tells the main process through multiprocessing's own objects: each sample puts its
    worker's pid on `queue` and adds one to `counter` (an mp.Value); values come from `items`."""

    def __init__(self, queue, counter, items):
        self.queue, self.counter, self.items = queue, counter, items

    def __len__(self):
        return 16

    def __getitem__(self, i):
        with self.counter.get_lock():
            self.counter.value += 1
        self.queue.put(os.getpid())
        return self.items[i]


class MarksShared(Dataset):
    """Marks each index it loads in a tensor in shared memory (``share_memory_()``): the main
    process sees what every worker wrote, under fork and spawn alike."""

    def __init__(self):
        self.seen = torch.zeros(16).share_memory_()

    def __len__(self):
        return 16

    def __getitem__(self, i):
        self.seen[i] = 1.0
        return i


def _dies_now(marks, signum, times) -> bool:
    """Claims the next start in `marks` (a file each); True when this start is to die (the first
    `times` starts; every one when `times` is None)."""
    if times is None:
        return True
    for k in range(times):
        try:
            os.close(os.open(os.path.join(marks, f"start-{k}"), os.O_CREAT | os.O_EXCL))
            return True
        except FileExistsError:
            continue
    return False


def die(signum) -> None:
    if signum == signal.SIGSEGV:
        ctypes.string_at(0)  # a real segmentation fault, as a C extension's
    os.kill(os.getpid(), signum)
    time.sleep(10)


class DiesWhileStarting(Squares):
    """Under spawn/forkserver a worker unpickles its dataset before it reports anything: this
    one dies there by `signum` (SIGKILL: the OOM killer, say; SIGSEGV: a real fault) at the first
    `times` starts (None: at every one), counted with files in `marks`."""

    def __init__(self, marks, signum, times=1, n=32):
        super().__init__(n)
        self.marks, self.signum, self.times = marks, signum, times

    def __setstate__(self, state):
        self.__dict__.update(state)
        if _dies_now(self.marks, self.signum, self.times):
            die(self.signum)


class RaisesWhileStarting(Squares):
    """Its unpickling raises in the worker (a missing file, a module that fails to import)."""

    def __setstate__(self, state):
        raise RuntimeError("cannot open the index of shard 0: No such file or directory")


class DieAtStart:
    """A worker_init_fn that dies by `signum` at the first `times` starts (None: every one)."""

    def __init__(self, marks, signum, times=1):
        self.marks, self.signum, self.times = marks, signum, times

    def __call__(self, worker_id):
        if _dies_now(self.marks, self.signum, self.times):
            die(self.signum)
