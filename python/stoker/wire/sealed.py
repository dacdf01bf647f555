"""What spawn and forkserver workers start from, pickled once: the dataset, ``collate_fn`` and
``worker_init_fn`` go into one sealed memfd that every worker of the iterator (and every worker
started again after a death) maps, instead of each receiving its own pickle through a pipe and
unpickling it into private memory.

Large buffers are placed beside the pickle, not inside it (pickle protocol 5's out-of-band
buffers): a NumPy array's data, a plain CPU tensor's bytes. A worker's copy of the dataset refers
to them in place: its memory does not grow with the dataset. A whole ``np.memmap``
(``np.load(mmap_mode=...)``) travels as its file, and what multiprocessing passes as a descriptor
(a ``stoker.SharedList``'s memfd, an ``mp.Queue``'s pipe, an ``mp.Value``'s arena) as that
descriptor, beside this one. The worker maps the memfd privately: its pages are shared
until the worker writes one, which then becomes that worker's own (copy-on-write, as under fork);
what a worker writes never reaches another worker or the main process. ``bytes`` objects cannot
live outside Python's heap, so they are unpickled into each worker (hold large blobs in a
NumPy array or a SharedList).

Layout: a 64-byte header (magic, pickle offset and length, table offset, buffer count), then the
buffers (64-byte aligned, written as the pickler meets them), the pickle, and the table
(offset, length, kind) of the buffers.

Not everything can be pickled once for many workers: a CUDA tensor's IPC handle, and a tensor
shared by name (torch's "file_system" strategy), count one receiver per pickle. For those,
``Sealed`` raises ``PerWorker`` and the placement pickles for each worker, as plain spawn does.
What a worker's copy differs in from plain spawn's: an array or tensor that is a view of another
comes back as its own copy (not sharing its base's memory), non-contiguous and expanded tensors
come back contiguous, and arrays do not own their memory (no in-place ``resize``).

Thread contract: ``Sealed(objects)`` runs on the thread that starts workers; ``close`` on any
thread (the placement holds its lock around it and around ``Process.start()``); a dropped
``Sealed`` closes its descriptors when collected. ``Sealed`` is pickled only while
``Process.start()`` runs (it passes its descriptors to the child); ``load`` runs once in the
worker, before its loop.
"""

from __future__ import annotations

import fcntl
import io
import mmap
import os
import pickle
import struct
import sys
import weakref
from multiprocessing import context, reduction

from ..common import system as _system
from ..pickling import pickler as _pickling
from . import fdpass

_MAGIC = b"STKSEAL1"
_HEADER = struct.Struct("<8sQQQQ")  # magic, pickle offset, pickle length, table offset, count
_ENTRY = struct.Struct("<QQQ")  # offset, length, kind
_ALIGN = 64
_DATA_START = 64
# Buffers smaller than this stay inside the pickle: below it a view costs more than the copy.
IN_BAND_BELOW = 4096
_OUT_OF_BAND, _TENSOR = 0, 1
# np.memmaps passed as their files at most: each is a descriptor held for the iterator's life and
# passed to every worker (forkserver passes 250 at most); the others are copied like any array.
MAX_MEMMAP_FILES = 64


class PerWorker(Exception):
    """The objects hold something whose reduction counts one receiver per pickle (a CUDA tensor's
    IPC handle, a tensor shared by file name): it must be pickled for each worker, as plain
    spawn does. The message names it."""


class _Writer(_pickling.Pickler):
    """Pickles into the memfd: buffers are written as they come, the pickle itself at the end.
    multiprocessing's reductions apply (its pipes, locks, shared ``Value``s, torch's CUDA
    tensors), as when ``Process.start()`` pickles; stoker's tensor rule comes first; what
    pickle refuses by name goes by value (``stoker.pickling.by_value``), by this same pickler, so these
    rules hold inside it too."""

    to_worker = True

    def __init__(self, fd: int, passed: list[int]):
        """`passed`: where the descriptors the pickle refers to go (the caller owns them)."""
        self._file = io.BytesIO()
        super().__init__(self._file, 5, buffer_callback=self._buffer, forking=True)
        self.fd = fd
        self.end = _DATA_START
        self.table: list[tuple[int, int, int]] = []
        self.extra_fds = passed
        self._ids: dict[int, tuple] = {}  # id(obj) -> its persistent id (an object seen twice)
        self._seen: list = []  # keeps those objects alive while their ids are in use
        self._memmaps = 0

    def _write(self, raw: memoryview, kind: int) -> int:
        offset = -(-self.end // _ALIGN) * _ALIGN
        _pwrite(self.fd, raw, offset)
        self.end = offset + raw.nbytes
        self.table.append((offset, raw.nbytes, kind))
        return len(self.table) - 1

    def _buffer(self, buf: pickle.PickleBuffer) -> bool:
        raw = buf.raw()
        if raw.nbytes < IN_BAND_BELOW:
            return True  # in band
        self._write(raw, _OUT_OF_BAND)
        return False

    def persistent_id(self, obj):
        np = sys.modules.get("numpy")
        if np is not None and isinstance(obj, np.memmap) and isinstance(obj.base, mmap.mmap):
            return self._remember(obj, lambda: self._memmap(obj))
        torch = sys.modules.get("torch")
        if torch is not None and type(obj) is torch.Tensor and _plain_cpu(torch, obj) \
                and not _is_shared(obj):
            return self._remember(obj, lambda: self._tensor(torch, obj))
        return None

    def _remember(self, obj, make):
        pid = self._ids.get(id(obj))
        if pid is None:
            pid = make()
            if pid is not None:
                self._ids[id(obj)] = pid
                self._seen.append(obj)
        return pid

    def reduce_other(self, obj):
        torch = sys.modules.get("torch")
        if torch is None:
            return NotImplemented
        if isinstance(obj, torch.Tensor):
            if obj.device.type not in ("cpu", "meta"):
                raise PerWorker(f"a {obj.device.type} tensor (torch shares it once per worker)")
            if _is_shared(obj):  # share_memory_(): it stays shared, through torch's reduction
                _fd_strategy_or_per_worker(torch, "a tensor in shared memory")
                return NotImplemented
        elif isinstance(obj, (torch.UntypedStorage, torch.storage.TypedStorage)):
            _fd_strategy_or_per_worker(torch, "a torch storage")
        return super().reduce_other(obj)

    # multiprocessing asks the Popen being started for each descriptor a pickle refers to
    # (``reduction.DupFd``): here the one pickle serves every worker, so it is passed to each,
    # beside the memfd, and found there by its place.
    def duplicate_for_child(self, fd: int) -> int:
        self.extra_fds.append(os.dup(fd))
        return len(self.extra_fds) - 1

    @staticmethod
    def DupFd(place: int) -> _PassedFd:  # noqa: N802 (multiprocessing's name)
        return _PassedFd(place)

    def dump(self, obj) -> None:
        before = context.get_spawning_popen()
        context.set_spawning_popen(self)  # what pickles only "while spawning" pickles here
        try:
            super().dump(obj)
        finally:
            context.set_spawning_popen(before)

    def _memmap(self, obj):
        """A whole np.memmap (np.load(mmap_mode=...)) travels as its file, opened here: the
        worker maps the same file (shared page cache, writes of "r+" reach the file as under
        fork); None (copied like any array) when the file cannot be opened any more."""
        mode = {"w+": "r+", "readonly": "r", "readwrite": "r+"}.get(obj.mode, obj.mode)
        if mode not in ("r", "r+") or self._memmaps >= MAX_MEMMAP_FILES:
            return None  # "c": the parent's own changes are in its pages, not the file's
        try:
            fd = os.open(obj.filename, os.O_RDWR if mode == "r+" else os.O_RDONLY)
        except (OSError, TypeError):
            return None
        st = os.fstat(fd)
        if _system.mapped_file(obj.ctypes.data) != (st.st_dev, st.st_ino):
            os.close(fd)  # the path names another file now (replaced since it was mapped)
            return None
        self._memmaps += 1
        self.extra_fds.append(fd)
        order = "F" if obj.flags.f_contiguous and not obj.flags.c_contiguous else "C"
        return ("memmap", len(self.extra_fds) - 1, obj.dtype.str, mode, obj.offset,
                tuple(obj.shape), order)

    def _tensor(self, torch, obj):
        t = obj.detach().resolve_conj().resolve_neg().contiguous()
        if t.numel() * t.element_size() < IN_BAND_BELOW:
            return None
        raw = memoryview(t.reshape(-1).view(torch.uint8).numpy()).cast("B")
        k = self._write(raw, _TENSOR)
        return ("tensor", k, str(t.dtype).split(".")[-1], tuple(t.shape), obj.requires_grad)

    def pickle_bytes(self) -> bytes:
        return self._file.getvalue()


def _is_shared(t) -> bool:
    try:
        return bool(t.is_shared())
    except (RuntimeError, NotImplementedError):  # a layout without storage (sparse, nested)
        return False


def _fd_strategy_or_per_worker(torch, what: str) -> None:
    """torch shares CPU memory by descriptor ("file_descriptor", any number of receivers) or by
    name with one reference per receiver ("file_system"): under the latter, per worker."""
    if torch.multiprocessing.get_sharing_strategy() != "file_descriptor":
        raise PerWorker(f"{what} (torch's 'file_system' sharing counts one receiver a pickle)")


def _pwrite(fd: int, raw: memoryview, offset: int) -> None:
    done = 0
    while done < raw.nbytes:
        done += os.pwrite(fd, raw[done:], offset + done)


def _plain_cpu(torch, t) -> bool:
    return (t.layout == torch.strided and t.device.type == "cpu" and not t.is_nested
            and not t.is_quantized and not t.is_meta)


class Sealed:
    """`objects` pickled once into a sealed memfd (raises what pickling raises, every
    descriptor closed). Its descriptors close with ``close`` or, at the latest, when it is
    garbage-collected."""

    def __init__(self, objects):
        fd = os.memfd_create("stoker-dataset", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        self._memfd = [fd]
        self._passed: list[int] = []  # descriptors passed beside it, in the pickle's order
        fdpass.track(fd)  # a forked worker of another loader closes it
        self._finalizer = weakref.finalize(self, _close_all, self._memfd, self._passed)
        try:
            w = _Writer(fd, self._passed)  # owned from the first, should pickling fail later
            w.dump(objects)
            table, end = w.table, w.end
            data = w.pickle_bytes()
            del w  # and the objects it kept alive
            at = -(-end // _ALIGN) * _ALIGN
            _pwrite(fd, memoryview(data), at)
            table_at = at + len(data)
            _pwrite(fd, memoryview(b"".join(_ENTRY.pack(*e) for e in table)), table_at)
            _pwrite(fd, memoryview(_HEADER.pack(_MAGIC, at, len(data), table_at, len(table))), 0)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK
                        | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        except BaseException:
            self.close()
            raise
        fdpass.track(*self._passed)
        self.nbytes = os.fstat(fd).st_size

    @classmethod
    def adopt(cls, fd: int, extra_fds: list[int]) -> Sealed:
        """A Sealed over descriptors another process made (the node pool's, received from a
        rank): `fd` is the sealed memfd, `extra_fds` those passed beside it; both now its."""
        self = cls.__new__(cls)
        self._memfd = [fd]
        self._passed = list(extra_fds)
        fdpass.track(fd, *self._passed)
        self._finalizer = weakref.finalize(self, _close_all, self._memfd, self._passed)
        self.nbytes = os.fstat(fd).st_size
        return self

    @property
    def fd(self) -> int | None:
        return self._memfd[0] if self._memfd else None

    @property
    def extra_fds(self) -> list[int]:
        return list(self._passed)

    def close(self) -> None:
        self._finalizer()

    def fds(self) -> list[int]:
        return self._memfd + self._passed

    def __reduce__(self):
        if self.fd is None:
            raise ValueError("stoker: this Sealed was closed")
        if context.get_spawning_popen() is None:
            raise TypeError("stoker: Sealed travels only to a process being started")
        return (_opened, (reduction.DupFd(self.fd),
                          [reduction.DupFd(f) for f in self.extra_fds]))


def _close_all(*lists: list[int]) -> None:
    for fds in lists:
        fdpass.untrack(*fds)
        for f in fds:
            try:
                os.close(f)
            except OSError:
                pass
        fds.clear()


class Opened:
    """A worker's end: the descriptors it was passed, until ``load``."""

    def __init__(self, fd: int, extra_fds: list[int]):
        self.fd = fd
        self.extra_fds = extra_fds

    def load(self):
        """The objects, their buffers viewing the memfd's pages (copy-on-write). Closes the
        descriptors (the mapping stays)."""
        fd, self.fd = self.fd, None
        try:
            size = os.fstat(fd).st_size
            m = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        view = memoryview(m)
        magic, p_at, p_len, t_at, count = _HEADER.unpack_from(view, 0)
        if magic != _MAGIC:
            raise RuntimeError("stoker: the worker's dataset memfd is not one stoker wrote")
        table = [_ENTRY.unpack_from(view, t_at + i * _ENTRY.size) for i in range(count)]
        buffers = [view[o:o + n] for o, n, _ in table]
        fds, self.extra_fds = self.extra_fds, []
        reader = _Reader(io.BytesIO(view[p_at:p_at + p_len]),
                         buffers=[b for b, e in zip(buffers, table) if e[2] == _OUT_OF_BAND],
                         tensors=buffers, fds=fds)
        global _loading
        _loading = reader
        try:
            return reader.load()
        finally:
            _loading = None
            reader.close_unused()


class _Reader(pickle.Unpickler):
    def __init__(self, file, *, buffers, tensors: list, fds: list):
        super().__init__(file, buffers=buffers)
        self.tensors = tensors
        self.fds = fds  # passed beside the memfd; each taken (None) by what it rebuilds

    def persistent_load(self, pid):
        # An object met twice was written once, under one id: it comes back as one object.
        memo = self.__dict__.setdefault("_objects", {})
        if pid not in memo:
            memo[pid] = self._make(pid)
        return memo[pid]

    def take(self, k: int) -> int:
        fd, self.fds[k] = self.fds[k], None
        return fd

    def close_unused(self) -> None:
        for fd in self.fds:
            if fd is not None:
                os.close(fd)

    def _make(self, pid):
        if pid[0] == "memmap":
            import numpy as np

            _, k, dtype, mode, offset, shape, order = pid
            with os.fdopen(self.take(pid[1]), "r+b" if mode == "r+" else "rb") as f:
                return np.memmap(f, dtype=np.dtype(dtype), mode=mode, offset=offset,
                                 shape=shape, order=order)
        if pid[0] == "tensor":
            import torch

            _, k, dtype_name, shape, requires_grad = pid
            t = torch.frombuffer(self.tensors[k], dtype=torch.uint8)
            t = t.view(getattr(torch, dtype_name)).reshape(shape)
            return t.requires_grad_(True) if requires_grad else t
        raise pickle.UnpicklingError(f"stoker: unknown reference {pid[0]!r} in the dataset memfd")


_loading: _Reader | None = None  # the one load running in this worker


class _PassedFd:
    """A descriptor the pickle refers to, by its place among those passed beside the memfd."""

    def __init__(self, place: int):
        self.place = place

    def detach(self) -> int:
        return _loading.take(self.place)


def _opened(dup, extra) -> Opened:
    return Opened(dup.detach(), [d.detach() for d in extra])
