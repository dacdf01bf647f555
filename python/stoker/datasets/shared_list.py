"""SharedList: a read-only list whose items cost no memory per worker.

A Python list of a million dicts is a million objects with reference counts. Every worker that
reads an item writes its reference count, so copy-on-write gives each worker its own copy of
every page it touched: with 8 workers the dataset's metadata takes 9 times the memory
("my DataLoader uses 9x the RAM"). A SharedList lays each item out once in one flat buffer in a
sealed memfd, with an offsets array beside it; reading item i builds a fresh object from the
buffer, which is only ever read. Workers share the pages whatever the start method: with
``spawn`` and ``forkserver`` the memfd is passed to the worker, not copied.

    paths = stoker.SharedList({"path": p, "label": y} for p, y in records)
    paths[17]  # -> a fresh dict equal to the original

Items of the common shapes (dicts with str keys, lists, tuples, str, bytes, ints, floats,
bools, None) are laid out by the engine (``_ext/py_shared_list.cc``) and read back without
pickle, at about the cost of building the dict; anything else in an item is pickled in its place
(an object of your own class, an int past 64 bits). Each item comes back as its own copy: two
references to one list inside an item come back as two lists.

A SharedList is immutable once built: read it from any thread and any process.
"""

from __future__ import annotations

import collections.abc
import mmap
import os
import pickle
import struct
import weakref
from collections.abc import Iterable, Sequence
from multiprocessing import reduction

from .. import _stoker

# magic, count, offsets' place, data's place, schemas' place, schemas' length
_HEADER = struct.Struct("<8s5q")
_MAGIC = b"STKSHL02"


def _dumps(obj) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


class SharedList(_stoker.SharedItems):
    _fd: int | None  # the memfd (None: a buffer of another system's, Ray's object store)

    def __init__(self, items: Iterable = ()):
        schemas: list = []
        data, offsets = _stoker.encode_items(items, schemas, {}, _dumps)
        schema_blob = _dumps(schemas)
        n = len(offsets) // 8 - 1
        offsets_at = _HEADER.size
        data_at = offsets_at + len(offsets)
        schema_at = data_at + len(data)
        size = schema_at + len(schema_blob)
        fd = os.memfd_create("stoker-sharedlist", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            with mmap.mmap(fd, size) as m:
                m[:offsets_at] = _HEADER.pack(_MAGIC, n, offsets_at, data_at, schema_at,
                                              len(schema_blob))
                m[offsets_at:data_at] = offsets
                m[data_at:schema_at] = data
                m[schema_at:size] = schema_blob
            import fcntl

            fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                        fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
        except BaseException:
            os.close(fd)
            raise
        del data, offsets
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
        magic, n, offsets_at, data_at, schema_at, schema_len = _HEADER.unpack_from(buffer, 0)
        if magic != _MAGIC:
            raise ValueError("stoker: this buffer holds no SharedList of this version")
        schemas = pickle.loads(memoryview(buffer)[schema_at:schema_at + schema_len])
        self._data_bytes = schema_at - data_at
        _stoker.SharedItems.__init__(self, buffer, n, offsets_at, data_at, schemas,
                                     pickle.loads)

    # (a Sequence's own methods, over __len__ and __getitem__)
    index = Sequence.index
    count = Sequence.count
    __iter__ = Sequence.__iter__
    __reversed__ = Sequence.__reversed__
    __contains__ = Sequence.__contains__

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
        return f"SharedList({len(self)} items, {self._data_bytes} bytes)"

    @property
    def nbytes(self) -> int:
        return self._map.nbytes if isinstance(self._map, memoryview) else len(self._map)


collections.abc.Sequence.register(SharedList)


def _release_free_memory() -> None:
    """Hands the temporary buffers' memory back to the kernel (glibc keeps freed heap pages
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
