"""The messages between the pool and its template (template.py, forker.py): one table, a frozen
dataclass per kind, as wire.py's is for the pool and its ranks. They travel over the same
frames (``wire.send`` / ``wire.recv``, descriptors beside them) on a socketpair made before the
template was forked: both ends are the same stoker, so no version is checked beyond the frame's.

Thread contract: immutable values, any thread.
"""

from __future__ import annotations

import dataclasses


# The template to the pool.
@dataclasses.dataclass(frozen=True)
class Started:
    """The template is ready to fork (its first message): its pid."""

    pid: int


@dataclasses.dataclass(frozen=True)
class Forked:
    """Request `rid` was forked into process `pid`; a pidfd of it comes beside (made before the
    template could reap it: it names that child for good, even once its pid is reused)."""

    rid: int
    pid: int


@dataclasses.dataclass(frozen=True)
class Exited:
    """The template reaped its child `pid`: its return code (multiprocessing's convention: the
    exit code, or minus the signal's number)."""

    pid: int
    code: int


# The pool to the template.
@dataclasses.dataclass(frozen=True)
class Fork:
    """Fork a worker running the pickled Process `payload` (request `rid`); the descriptors it
    refers to come beside, by their place (``template.InheritedFd``)."""

    rid: int
    payload: bytes


TEMPLATE_SENDS = (Started, Forked, Exited)
POOL_SENDS = (Fork,)
