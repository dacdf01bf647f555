"""One gate for the samples a worker loads at once on threads (``threads_per_worker``).

``Gate(width)`` runs the loads handed to it (``submit``) on threads of its own, at most `width`
of them at a time, in the order they were handed in; the rest wait in its queue. The width may
change at any time (``resize``, as "auto" tunes it): a load already running finishes, and no new
one starts while `width` or more run. So whatever the width was when a load was handed in (a
batch started ahead, the batch after a narrowing), the bound is the gate's, not a pool's size: a
swap of thread pools on a width change could let the old pool's loads and the new pool's run side
by side.

Threads are started as the width and the queue need them (never more than the widest width the
gate had) and live until ``close()``; they are daemon threads of the process that made the gate (a
copy made by fork has none: ``usable()`` is False there, and the copy must not be used).

Thread contract: ``submit``, ``resize``, ``running`` and ``close`` may be called from any thread;
the loads run on the gate's threads (a load must be thread-safe against the others).
"""

from __future__ import annotations

import collections
import os
import threading
from concurrent.futures import Future


class Gate:
    """At most `width` loads at once, first in first out (see the module's doc)."""

    def __init__(self, width: int, name: str = "stoker-sample"):
        if width < 1:
            raise ValueError(f"a gate's width is at least 1, got {width}")
        self._cv = threading.Condition()
        self._width = width
        self._running = 0
        self._queue: collections.deque = collections.deque()  # (future, fn, arg)
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._name = name
        self._pid = os.getpid()
        self.peak = 0  # the most loads that ever ran at once

    @property
    def width(self) -> int:
        return self._width

    @property
    def running(self) -> int:
        """How many loads run now."""
        return self._running

    @property
    def threads(self) -> int:
        """How many threads the gate has started."""
        return len(self._threads)

    def usable(self) -> bool:
        """False in a copy of the gate made by fork (it has no threads) and once closed."""
        return self._pid == os.getpid() and not self._closed

    def submit(self, fn, arg) -> Future:
        """A future for ``fn(arg)``, run once a place at the gate is free."""
        future: Future = Future()
        with self._cv:
            if self._closed:
                raise RuntimeError("stoker: the gate is closed")
            self._queue.append((future, fn, arg))
            self._enough_threads()
            self._cv.notify()
        return future

    def resize(self, width: int) -> None:
        """From now on at most `width` at once (loads running past it finish)."""
        if width < 1:
            raise ValueError(f"a gate's width is at least 1, got {width}")
        with self._cv:
            widened = width > self._width
            self._width = width
            if widened:
                self._enough_threads()
                self._cv.notify_all()

    def cancel_waiting(self) -> None:
        """Cancels the loads that have not started (their futures say so)."""
        with self._cv:
            waiting, self._queue = self._queue, collections.deque()
        for future, _, _ in waiting:
            future.cancel()

    def close(self) -> None:
        """Cancels what waits; the threads end once their load (if any) is done."""
        with self._cv:
            self._closed = True
            waiting, self._queue = self._queue, collections.deque()
            self._cv.notify_all()
        for future, _, _ in waiting:
            future.cancel()

    # -- its threads -----------------------------------------------------------------------------
    def _enough_threads(self) -> None:
        # (with the lock) a thread for each load that may start now: those running plus those
        # waiting, up to the width
        need = min(self._width, self._running + len(self._queue))
        while len(self._threads) < need:
            t = threading.Thread(target=self._serve, name=f"{self._name}_{len(self._threads)}",
                                 daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self) -> None:
        cv = self._cv
        while True:
            with cv:
                while not self._closed and (not self._queue or self._running >= self._width):
                    cv.wait()
                if self._closed:
                    return
                future, fn, arg = self._queue.popleft()
                self._running += 1
                self.peak = max(self.peak, self._running)
            try:
                if future.set_running_or_notify_cancel():
                    try:
                        result = fn(arg)
                    except BaseException as e:  # the future holds it for the one who waits
                        future.set_exception(e)
                    else:
                        future.set_result(result)
            finally:
                with cv:
                    self._running -= 1
                    if self._queue and self._running < self._width:
                        cv.notify()
