"""SharedList: a read-only list whose items cost no memory per worker.

A Python list of a million dicts is a million objects with reference counts. Every worker that
reads an item writes its reference count, so copy-on-write gives each worker its own copy of
every page it touched: with 8 workers the dataset's metadata takes 9 times the memory
("my DataLoader uses 9x the RAM"). A SharedList pickles each item once into one flat buffer in a
sealed memfd, with an offsets array beside it; reading item i unpickles it from the buffer,
which is only ever read. Workers share the pages whatever the start method: with ``spawn`` and
``forkserver`` the memfd is passed to the worker, not copied.

    paths = stoker.SharedList({"path": p, "label": y} for p, y in records)
    paths[17]  # -> a fresh dict equal to the original

A SharedList is immutable once built: read it from any thread and any process.
"""

from __future__ import annotations

import mmap
import os
import pickle
import weakref
from collections.abc import Iterable, Sequence
from multiprocessing import reduction

import numpy as np

_HEADER = 16  # int64 count, int64 data offset


class SharedList(Sequence):
    def __init__(self, items: Iterable = ()):
        blobs = [pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL) for x in items]
        n = len(blobs)
        offsets = np.zeros(n + 1, dtype=np.int64)
        if n:
            np.cumsum([len(b) for b in blobs], out=offsets[1:])
        data_offset = _HEADER + offsets.nbytes
        size = max(1, data_offset + int(offsets[-1]))
        fd = os.memfd_create("stoker-sharedlist", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            with mmap.mmap(fd, size) as m:
                m[:_HEADER] = np.array([n, data_offset], dtype=np.int64).tobytes()
                m[_HEADER:data_offset] = offsets.tobytes()
                m[data_offset:size] = b"".join(blobs)
            import fcntl

            fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                        fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
        except BaseException:
            os.close(fd)
            raise
        del blobs
        _release_free_memory()
        self._attach(fd)

    def _attach(self, fd: int) -> None:
        self._fd = fd
        weakref.finalize(self, os.close, fd)  # the mapping outlives it; the descriptor need not
        size = os.fstat(fd).st_size
        self._view(mmap.mmap(fd, size, prot=mmap.PROT_READ))

    def _view(self, buffer) -> None:
        """Reads the items from `buffer` (a mapping, or another system's shared buffer)."""
        self._map = buffer
        n, data_offset = np.frombuffer(self._map, dtype=np.int64, count=2)
        self._n = int(n)
        self._offsets = np.frombuffer(self._map, dtype=np.int64, count=self._n + 1,
                                      offset=_HEADER)
        self._data = memoryview(self._map)[int(data_offset):]

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("SharedList index out of range")
        start, end = int(self._offsets[i]), int(self._offsets[i + 1])
        return pickle.loads(self._data[start:end])

    def __reduce_ex__(self, protocol):
        from multiprocessing import context

        if self._fd is not None and context.get_spawning_popen() is not None:
            # spawn / forkserver: the worker maps the same memfd instead of receiving a copy.
            return (_rebuild, (reduction.DupFd(self._fd),))
        # Elsewhere (Ray's object store, a file): the buffer itself, out of band where the
        # pickler takes it (protocol 5), so Ray keeps one copy per node that its actors map.
        if protocol >= 5:
            return (_from_buffer, (pickle.PickleBuffer(self._map),))
        return (_from_buffer, (bytes(self._map),))

    def __repr__(self) -> str:
        return f"SharedList({self._n} items, {len(self._data)} bytes)"

    @property
    def nbytes(self) -> int:
        return self._map.nbytes if isinstance(self._map, memoryview) else len(self._map)


def _release_free_memory() -> None:
    """Hands the temporary pickles' memory back to the kernel (glibc keeps freed heap pages
    resident otherwise, and forked workers would each see them as part of the parent)."""
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _rebuild(dup) -> SharedList:
    obj = SharedList.__new__(SharedList)
    obj._attach(dup.detach())
    return obj


def _from_buffer(buffer) -> SharedList:
    obj = SharedList.__new__(SharedList)
    obj._fd = None
    obj._view(memoryview(buffer).cast("B"))
    return obj
