"""At interpreter exit, stoker's live iterators stop their workers before multiprocessing does.

multiprocessing's own exit hook terminates daemonic children with SIGTERM, so a worker then dies
without running its exit cleanup: a semaphore it created (a ``multiprocessing.Lock``, tqdm's
lock) stays registered with the resource tracker, which prints "resource_tracker: There appear
to be N leaked semaphore objects" (torch's loader does the same). This hook is registered after
multiprocessing's, so it runs first, and each iterator's ``shutdown()`` asks its workers
to stop: they return from their loop and clean up as any process does.

Thread contract: ``track`` may be called from any thread.
"""

from __future__ import annotations

import atexit
import threading
import weakref

_live: weakref.WeakSet = weakref.WeakSet()
_lock = threading.Lock()
_registered = False


def track(iterator) -> None:
    """Shuts `iterator`'s workers down at exit if it is still alive then."""
    global _registered
    with _lock:
        _live.add(iterator)
        if not _registered:
            import multiprocessing.util  # noqa: F401  (its hook first, so ours runs before it)

            atexit.register(_shutdown_all)
            _registered = True


def _shutdown_all() -> None:
    with _lock:
        live = list(_live)
    for it in live:
        try:
            it.shutdown()
        except Exception:
            pass
