"""One gate for the samples a worker loads at once on threads (``threads_per_worker``).

``Gate(width)`` runs the loads handed to it (``submit``) on threads of its own, at most `width`
of them at a time, in the order they were handed in; the rest wait in its queue. The width may
change at any time (``resize``, as "auto" tunes it): a load already running finishes, and no new
one starts while `width` or more run. So whatever the width was when a load was handed in (a
batch started ahead, the batch after a narrowing), the bound is the gate's, not a pool's size: a
swap of thread pools on a width change could let the old pool's loads and the new pool's run side
by side.

A load the caller runs on its own thread (one sample at a time, so that the worker's status page
names it: a retry, a batch re-issued after a death) takes a place at the gate too (``place()``),
so it counts against the width beside the loads of a batch started ahead.

Threads are started as the width and the queue need them (never more than the widest width the
gate had), each with a place number; those whose number is past the width now are parked (they
wait apart and take no load until a widening wakes them). Left among the ones that serve, they
would take loads in turn, since each load done wakes the next waiting thread: on a free-threaded
Python 8 threads behind a gate of width 2 were each runnable ~75% of the time, taking turns on
the CPUs ("auto" that went 8 -> 1 -> 2 delivered 0.87 of a fixed 2). Parked, not ended: a
thread's CPU stays in what the kernel says of its process's live threads (schedstat), which
"auto" and the stall notice read. They live until ``close()``, until the gate is collected
(they hold what they share with it, not the gate) or until the interpreter exits (every gate is
closed then, and its threads joined, as concurrent.futures does for its pools). A copy made by fork has none:
``usable()`` is False there, and the copy must not be used.

``report_running(fn)``: `fn(n)` is called with how many loads run each time that changes (the
worker's status page shows it: the samples loading at once, those of a batch started ahead
included), under the gate's lock: `fn` must be quick and must not call the gate (what it raises
is dropped). It must not hold the gate or what holds it (its threads would keep it alive).

Thread contract: ``submit``, ``place``, ``resize``, ``running``, ``report_running`` and ``close``
may be called from any thread; the loads run on the gate's threads (a load must be thread-safe
against the others).
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
import weakref
from concurrent.futures import Future


class Gate:
    """At most `width` loads at once, first in first out (see the module's doc)."""

    def __init__(self, width: int, name: str = "stoker-sample"):
        if width < 1:
            raise ValueError(f"a gate's width is at least 1, got {width}")
        self._s = _State(width, name)
        self._pid = os.getpid()
        # Its threads hold the state, not the gate: a gate no one holds any more (a
        # single-process iterator's, after its epoch) ends its threads as it is collected.
        weakref.finalize(self, self._s.close)

    @property
    def width(self) -> int:
        return self._s.width

    @property
    def running(self) -> int:
        """How many loads run now (those of ``place()`` included)."""
        return self._s.running

    @property
    def threads(self) -> int:
        """How many threads the gate has started (those past the width are parked)."""
        with self._s.cv:
            return len(self._s.threads)

    @property
    def peak(self) -> int:
        """The most loads that ever ran at once."""
        return self._s.peak

    def usable(self) -> bool:
        """False in a copy of the gate made by fork (it has no threads) and once closed."""
        return self._pid == os.getpid() and not self._s.closed

    def submit(self, fn, arg) -> Future:
        """A future for ``fn(arg)``, run on a thread of the gate once a place is free."""
        future: Future = Future()
        s = self._s
        with s.cv:
            if s.closed:
                raise RuntimeError("stoker: the gate is closed")
            s.queue.append((future, fn, arg))
            s.enough_threads()
            s.cv.notify()
        return future

    @contextlib.contextmanager
    def place(self):
        """A place at the gate for a load the calling thread runs itself (one sample at a time
        on the worker's main thread, which names it on the status page): waits until fewer
        than the width run, ahead of what waits in the queue (the batch loading now comes
        before the next one started ahead)."""
        s = self._s
        with s.cv:
            s.placing += 1
            try:
                s.cv.wait_for(lambda: s.running < s.width)
            finally:
                s.placing -= 1
            s.took_place()
        try:
            yield
        finally:
            with s.cv:
                s.left_place()

    def resize(self, width: int) -> None:
        """From now on at most `width` at once (loads running past it finish)."""
        if width < 1:
            raise ValueError(f"a gate's width is at least 1, got {width}")
        s = self._s
        with s.cv:
            if width == s.width:
                return
            widened = width > s.width
            s.width = width
            if widened:
                s.parked.notify_all()  # (those now within the width serve again)
                s.enough_threads()
            s.cv.notify_all()  # (narrowed: the threads now past the width park)

    def report_running(self, fn) -> None:
        """From now on `fn(n)` is called as the number of loads running changes to `n` (the
        module's doc says what `fn` may do); None: no more."""
        s = self._s
        with s.cv:
            s.on_running = fn
            s.report()

    def cancel_waiting(self) -> None:
        """Cancels the loads that have not started (their futures say so)."""
        s = self._s
        with s.cv:
            waiting, s.queue = s.queue, collections.deque()
        for future, _, _ in waiting:
            future.cancel()

    def close(self) -> None:
        """Cancels what waits; the threads end once their load (if any) is done."""
        self._s.close()


class _State:
    """What a gate's threads share with it (they hold this, never the Gate). All fields under
    `cv`'s lock, which `parked` (where threads past the width wait) shares."""

    def __init__(self, width: int, name: str):
        lock = threading.Lock()
        self.cv = threading.Condition(lock)
        self.parked = threading.Condition(lock)
        self.width = width
        self.running = 0
        self.peak = 0
        self.placing = 0  # threads waiting in Gate.place()
        self.queue: collections.deque = collections.deque()  # (future, fn, arg)
        self.threads: list[threading.Thread] = []
        self.closed = False
        self.on_running = None  # Gate.report_running's `fn`
        self.name = name
        self.pid = os.getpid()
        _live.add(self)

    def took_place(self) -> None:
        self.running += 1
        self.peak = max(self.peak, self.running)
        self.report()

    def left_place(self) -> None:
        self.running -= 1
        self.report()
        if self.running < self.width:
            if self.placing:  # (its predicate is not the threads': wake every waiter)
                self.cv.notify_all()
            elif self.queue:
                self.cv.notify()

    def report(self) -> None:
        """`on_running` told the count (a report is status only: one that raises is dropped,
        so that a thread never dies holding a place)."""
        if self.on_running is not None:
            try:
                self.on_running(self.running)
            except Exception:
                pass

    def close(self) -> None:
        if self.pid != os.getpid():
            return  # (a copy made by fork: its threads are the parent's)
        with self.cv:
            self.closed = True
            waiting, self.queue = self.queue, collections.deque()
            self.cv.notify_all()
            self.parked.notify_all()
        for future, _, _ in waiting:
            future.cancel()

    def enough_threads(self) -> None:
        # (with the lock) a thread for each load that may start now: those running plus those
        # waiting, up to the width
        need = min(self.width, self.running + len(self.queue))
        while len(self.threads) < need:
            place = len(self.threads)
            t = threading.Thread(target=_serve, args=(self, place), name=f"{self.name}_{place}")
            self.threads.append(t)
            t.start()


# Every gate's state, closed as the interpreter begins to exit, before it joins its threads (as
# concurrent.futures does for its pools): a thread that waits for loads ends, one that loads
# ends after that load. Threads that lived on as daemons into the interpreter's finalization
# could be inside torch's C++ code then, where Python ends a thread by unwinding it: "terminate
# called without an active exception" and an abort.
_live: weakref.WeakSet = weakref.WeakSet()


def _close_all() -> None:
    for s in list(_live):
        s.close()


threading._register_atexit(_close_all)  # type: ignore[attr-defined]


def _serve(s: _State, place: int) -> None:
    """A gate thread's life: the loads of the queue, one at a time, while its place number is
    within the width; parked while it is not."""
    cv = s.cv
    while True:
        with cv:
            while not s.closed:
                if place >= s.width:  # narrowed past it: parked until a widening
                    s.parked.wait()
                elif s.queue and s.running < s.width:
                    break
                else:
                    cv.wait()
            if s.closed:
                return
            future, fn, arg = s.queue.popleft()
            s.took_place()
        try:
            if future.set_running_or_notify_cancel():
                try:
                    result = fn(arg)
                except BaseException as e:  # the future holds it for the one who waits
                    future.set_exception(e)
                else:
                    future.set_result(result)
        finally:
            # The load is let go before the thread waits again: `fn` is bound to what holds
            # the gate (a fetcher), and a thread that kept it would keep its own gate alive,
            # and so itself, after everyone else let go (a single-process iterator's each epoch).
            future = fn = arg = result = None
            with cv:
                s.left_place()
