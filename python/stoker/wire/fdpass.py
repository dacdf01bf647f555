"""Passing a worker its end of the channel, whatever the start method; and closing, in a forked
worker, every engine descriptor that is not its own.

With ``fork`` the descriptor is simply inherited. With ``spawn`` and ``forkserver``, Process
arguments are pickled while ``Process.start()`` runs; ``multiprocessing.reduction.DupFd`` then
asks the starting Popen to pass the descriptor to the child (no resource_sharer thread).

Thread contract: ``track``/``untrack``/``register_supervisor`` may be called from any thread
(a set's add and discard are atomic under the GIL); ``close_inherited`` runs in a new worker
before it starts any thread.
"""

from __future__ import annotations

import os
import weakref
from multiprocessing import reduction


class ChannelFd:
    """A file descriptor that reaches the worker process under every start method."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        return (_rebuild, (reduction.DupFd(self.fd),))


def _rebuild(dup) -> ChannelFd:
    return ChannelFd(dup.detach())


# Descriptors owned by engines in this process. A forked worker inherits them all and must close
# every one that is not its own: a main process's socket end held open by a worker would hide the
# main process's death from its sibling.
_supervisors: weakref.WeakSet = weakref.WeakSet()
_pending: set[int] = set()  # descriptors not yet owned by a supervisor (a channel being handed
#                             over, a board)


def register_supervisor(sup) -> None:
    _supervisors.add(sup)


def track(*fds: int) -> None:
    """`fds` are engine descriptors a forked worker must close (until ``untrack``)."""
    _pending.update(fds)


def untrack(*fds: int) -> None:
    _pending.difference_update(fds)


def engine_fds() -> set[int]:
    fds = set(_pending)
    for sup in list(_supervisors):
        fds.update(sup.owned_fds())
    return fds


def close_inherited(keep: int) -> None:
    for fd in engine_fds():
        if fd != keep:
            try:
                os.close(fd)
            except OSError:
                pass
    forget_all()


def forget_all() -> None:
    """Forgets every engine descriptor without closing it: in a process that has already
    closed them all (the node pool's template), whose numbers may now be reused."""
    _pending.clear()
    _supervisors.clear()
