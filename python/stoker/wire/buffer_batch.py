"""``BufferBatch``: the handle a placement gives with ``BatchReady`` (``events.BatchHandle``)
when the batch lies in a buffer this process can map: the node pool's slot, a Ray object.

``decode()`` builds the batch's tensors as views of the buffer (``_stoker.decode_buffer``: every
offset validated first) and arranges for ``release`` to run once the last view is gone;
``discard()`` runs it at once, without decoding; a handle that is dropped with neither runs it
when it is collected. ``release`` runs exactly once, in whatever thread lets go of the last view
(a garbage collection included): it must take no lock that thread may hold, so a placement makes
it queue the news (node: a pipe to its sender thread), never write a socket itself.

Thread contract: ``decode`` and ``discard`` by the thread that iterates, at most one of them,
once; ``release`` from any thread.
"""

from __future__ import annotations

import weakref
from typing import Callable

from .. import _stoker


class _Once:
    def __init__(self, fn: Callable[[], None] | None):
        self._fn = fn

    def __call__(self) -> None:
        fn, self._fn = self._fn, None
        if fn is not None:
            try:
                fn()
            except Exception:  # (a finalizer's error would only be printed, mid-GC)
                pass


def _dropped(drop: Callable[[], None] | None, release: _Once) -> None:
    try:
        if drop is not None:
            drop()
    finally:
        release()


class BufferBatch:
    """A batch in the buffer `open_buffer()` returns (called once, by ``decode``). `on_view`
    sees the buffer as its views are made (Ray counts what the user holds); `release` runs once
    its views are all gone, or at ``discard``; `drop` frees what ``open_buffer`` would have
    used when the batch is discarded unopened (a descriptor)."""

    def __init__(self, open_buffer: Callable[[], object], *,
                 release: Callable[[], None] | None = None,
                 on_view: Callable[[object], None] | None = None,
                 drop: Callable[[], None] | None = None):
        self._open = open_buffer
        self._on_view = on_view
        self._release = _Once(release)
        self._releases = release is not None
        self._finalizer = weakref.finalize(self, _dropped, drop, self._release)

    def decode(self):
        self._finalizer.detach()
        try:
            buf = self._open()
        except BaseException:
            self._release()
            raise
        if self._on_view is not None:
            self._on_view(buf)
        if self._releases:  # (else nothing to run when its views are gone: no finalizer)
            weakref.finalize(buf, self._release)
        return _stoker.decode_buffer(buf)

    def discard(self) -> None:
        self._finalizer()
