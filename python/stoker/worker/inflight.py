"""Many samples in flight inside one worker: ``threads_per_worker`` (docs/design/threads.md).

A batch's samples are loaded at once by up to N threads of the worker (behind one gate of width
N, ``gate.Gate``, whose threads are made in the worker after it started), or, for an ``async def
__getitem__``, as up to N coroutines on one event loop of the worker. Either way the results come back in sampler order, so the batch is the one the
same loader builds with one thread; each sample goes through the error policy on its own
(``fetch.attempt`` decides what a failure means).

``threads_per_worker="auto"``: ``Width`` picks how many at once from what the batches before
measured (the second batch at each width): it widens while the samples per second rise and the
worker waits (its threads are on a CPU, or waiting for one, well below its wall time: they wait on
the network), and goes back to the narrower width when widening did not pay. Waiting for a CPU
(the kernel's run queue, ``system.thread_runqueue_ns``: a machine whose cores are all taken) is
computing, not waiting; where only the run queue says so, one thread alone says which. A dataset
that computes gets one thread where the GIL runs Python one thread at a time (more would only
take turns); on a free-threaded interpreter its threads compute at once, and "auto" widens it
from one thread while its samples per second rise, up to its share of the CPUs
(``LoadSettings.cpus``).

Thread contract: ``InFlight`` belongs to the thread that loads (the worker's main thread); the
threads of its gate run only the sample loads handed to them, and call the dataset and the
per-sample callback (which must be thread-safe: the worker's is).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from concurrent.futures import as_completed

from ..common import system as _system
from ..config.load import LoadSettings, is_async
from ..config.options import MAX_THREADS_PER_WORKER as MAX_THREADS
from .gate import Gate

# "auto" widens while the worker's time on a CPU or waiting for one (the run queue) is below
# this share of its wall time
WAITING_SHARE = 0.6
# A widening is kept when it raised the samples per second by this factor at least (else the
# width goes back to the one before, and stays): threads that wait for what serves no more at
# once (the GIL, a full link, a server's limit) do not raise them. Above a rate's noise over a
# few batches on a busy machine; far below what a widening of at least twice the threads gives
# a worker that waits on I/O.
GAIN = 1.1
START = 8  # where "auto" starts: a batch of it tells waiting from computing
JUMP = 0.8  # a waiting worker widens to this share of what would keep its CPU busy
# A width is judged over full batches (after its first) holding at least this many samples per
# thread: with the next batch's samples loading during one batch's last ones, a batch no larger
# than the width says little alone, while a batch of many rounds of the threads is enough.
JUDGED_ROUNDS = 2


class Width:
    """How many samples load at once: fixed, or tuned ("auto") as batches are delivered.

    "auto" starts at START. Each width is judged over the full batches after its first (which
    pays for what is new: threads, connections) that hold JUDGED_ROUNDS samples per thread:
    their samples per second (from one batch's end to the next's, as the worker delivers them),
    and the worker's time on a CPU and on the run queue (``runqueue_s``: runnable while every CPU
    it may use was taken) against that wall time. At least WAITING_SHARE of it: the worker
    computes. One on a CPU that much by itself at its first width goes to one thread and stays
    there where the GIL runs one thread at a time (`gil`). One that reaches the share only with
    the run queue is judged again at one thread: on a busy machine a thread that computes waits
    for a CPU, but so does each of many threads that wait on I/O as it wakes, and their sum can
    pass the wall time; alone, a thread that waits on I/O shows it. Without the GIL (free-threaded
    Python) a worker that computes at one thread doubles from there while each doubling raises
    the samples per second GAIN times, up to `cpus` threads (its share of the CPUs); with it, it
    stays at one. One that waits jumps by the share it waited (a worker on a CPU 5% of the time
    could run about 20 times as many samples at once before its CPU is the limit; it takes JUMP
    of that), up to the batch's size (MAX_THREADS at most); once its CPU is busy it tries
    doublings. Every widening must raise the samples per second GAIN times: one that did not is
    undone (the width before, and it stays): threads that wait for the GIL, not for I/O, are
    not widened."""

    def __init__(self, setting, cpus: int = 1, gil: bool | None = None):
        """`cpus`: the CPUs this worker may keep busy (``LoadSettings.cpus``); `gil`: whether
        Python runs one thread at a time here (None: this interpreter, ``system.gil_enabled``)."""
        self.auto = setting == "auto"
        self.now = START if self.auto else int(setting)
        self.cpus = max(1, int(cpus))
        self.gil = _system.gil_enabled() if gil is None else bool(gil)
        self._rate_at: dict[int, float] = {}
        self._before: int | None = None  # the width before the last widening
        self._from_one = False  # judged again from one thread (a worker that computes)
        self.settled = not self.auto
        self._size = 0  # the largest batch seen: only such batches judge a width
        # the first batch at a width pays for what the width is new to (connections opened,
        # threads started, imports): the next one measures it
        self._fresh = True
        self._window = [0, 0.0, 0.0, 0.0]  # samples, wall s, CPU s, run-queue s

    @property
    def _computing_most(self) -> int:
        """The most threads that compute at once: 1 under the GIL, else the worker's CPUs."""
        return 1 if self.gil else self.cpus

    def observe(self, samples: int, wall_s: float, cpu_s: float, runqueue_s: float = 0.0) -> None:
        """One batch of `samples` took `wall_s`, of which the process's threads spent `cpu_s` on
        a CPU and `runqueue_s` waiting for one."""
        if self.settled or samples < 2 or wall_s <= 0:
            return
        self._size = max(self._size, samples)
        if samples < self._size:  # a short (last) batch: its rate is not the width's
            return
        if self._fresh:
            self._fresh = False
            self._window = [0, 0.0, 0.0, 0.0]
            return
        win = self._window
        win[0] += samples
        win[1] += wall_s
        win[2] += cpu_s
        win[3] += max(0.0, runqueue_s)
        if win[0] < JUDGED_ROUNDS * self.now:
            return
        wall_s, cpu_s, busy_s = win[1], win[2], win[2] + win[3]
        w = self.now
        rate = self._rate_at[w] = win[0] / wall_s
        computing = busy_s >= WAITING_SHARE * wall_s
        last = self._before
        before = self._rate_at.get(last) if last is not None else None
        if last is not None and before is not None and rate < GAIN * before:
            self.now, self.settled = last, True  # the last widening did not pay
            return
        most = MAX_THREADS
        if computing and before is None and not self._from_one:
            # its first batches kept it on a CPU or waiting for one
            if self._computing_most == 1 and cpu_s >= WAITING_SHARE * wall_s:
                self.now, self.settled = 1, True  # more threads would only share the GIL
                return
            # judged again at one thread (see the class doc)
            self._from_one, self.now, self._fresh = True, 1, True
            return
        if computing:
            factor = 2  # a doubling, as long as each one pays
            if self._from_one:
                most = self._computing_most  # computing threads: no more than its CPUs
        else:
            # a worker that waits jumps by the share it waited
            factor = max(2, int(JUMP * wall_s / max(busy_s, 1e-6)))
            self._from_one = False
        wider = min(most, self._size, w * factor)
        if wider <= w:
            self.settled = True
            return
        self._before, self.now, self._fresh = w, wider, True


class InFlight:
    """Loads items at once: ``map(load, items)`` returns ``[(ok, value, error)]`` in the items'
    order; ``start(load, items)`` returns the ``Batch`` under way, for a caller that acts as
    its items are done (the worker loop reads ahead then). `load(item)` returns the sample (or, for an async dataset, a coroutine for it) or
    raises; `ok` is False when it raised, `error` then holds the exception.

    One gate bounds what loads at once on threads (``gate.Gate``, of the width now): the
    batch's samples and those of the next batch started ahead (``start_ahead``) go through it,
    so never more than the width load at once, whatever the width was when they were handed in.
    A batch started ahead is always taken up by its ``map``, whatever the width became (each
    sample is loaded once)."""

    def __init__(self, dataset, settings: LoadSettings, width: Width | None = None):
        """`settings`: the worker's (its ``threads``, resolved: an int or "auto"); `width`: one
        kept from an earlier epoch's InFlight (what "auto" learnt)."""
        self.width = width if width is not None else Width(settings.threads, settings.cpus)
        self.is_async = is_async(dataset)
        self._gate: Gate | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = os.getpid()
        self._ahead: dict = {}  # batch key -> the futures of its items, started ahead
        self._ahead_at: dict = {}  # batch key -> when they started (_now)
        self._done_at: tuple | None = None  # when the last batch was done (_now)
        self._on_running = None  # report_running's `fn`, handed to the gate

    def report_running(self, fn) -> None:
        """`fn(n)`: how many samples load on this process's threads now, as it changes
        (``Gate.report_running``: a batch started ahead's included); None: no more."""
        self._on_running = fn
        if self._gate is not None and self._gate.usable():
            self._gate.report_running(fn)

    @property
    def concurrent(self) -> bool:
        """Whether a batch's samples may load at once (else the caller loads them one by one,
        as before threads existed)."""
        return self.is_async or self.width.auto or self.width.now > 1

    @property
    def peak(self) -> int:
        """The most samples that loaded at once on this process's threads so far."""
        return self._gate.peak if self._gate is not None and self._gate.usable() else 0

    def start(self, load, items, serial: bool = False, progress=None, key=None) -> Batch:
        """Starts loading `items`; the ``Batch`` returned yields as each is done and gives the
        outcomes. `serial`: one at a time whatever the width (a batch re-issued after its
        worker died with several samples in flight, so the death names the one that caused
        it); `progress(in_flight)` is called on this thread before the first item and as each
        is done, with how many load at once now (the worker's hang watch then times the wait
        for the next sample, not the whole batch). Threads only: `key` names the batch, whose
        items may have started already (``start_ahead``: then they are these items' loads,
        taken up whatever the width is now). Only items on the gate's threads start here;
        the rest (one at a time, an event loop's coroutines) load in ``Batch.outcomes``."""
        ahead = self._ahead.pop(key, None) if key is not None else None
        began = self._ahead_at.pop(key, None) if key is not None else None
        n = 1 if serial else min(self.width.now, len(items))
        if progress is not None:
            total, report = len(items), progress
            done = [0]

            def progress():
                report(min(n, total - done[0]))
                done[0] += 1

            progress()
        begin = self._now()
        if began is not None:  # its samples started while the batch before loaded: its
            # time is from when that one was done (what the worker delivers per second)
            begin = max(began, self._done_at or begin)
        futures = ahead
        if futures is None and not self.is_async and n > 1:
            gate = self._the_gate()
            futures = [gate.submit(_call_with, (load, it)) for it in items]
        return Batch(self, load, items, n, serial, progress, begin, futures)

    def map(self, load, items, serial: bool = False, progress=None, key=None) -> list:
        """``[(ok, value, error)]`` of `items`, in their order (``start``, then its outcomes)."""
        return self.start(load, items, serial, progress, key).outcomes()

    def finished(self, batch: Batch) -> None:
        """`batch` is done (``Batch.outcomes``): "auto" judges its width from it, the gate
        follows the width."""
        end = self._done_at = self._now()
        if not batch.serial:
            self.width.observe(len(batch.items), end[0] - batch.begin[0],
                               end[1] - batch.begin[1], max(0.0, end[2] - batch.begin[2]))
            if self._gate is not None and self._gate.usable():
                self._gate.resize(self.width.now)

    def one_by_one(self, load, items, progress) -> list:
        """`items` loaded on this thread (``Batch.outcomes``; the status page names each
        sample), each load in a place at the gate, if there is one (what was started ahead
        may still load on it)."""
        gate = self._gate if self._gate is not None and self._gate.usable() else None
        out = []
        for it in items:
            if gate is None:
                out.append(_call(load, it))
            else:
                with gate.place():
                    out.append(_call(load, it))
            if progress is not None:
                progress()
        return out

    def _now(self) -> tuple[float, float, float]:
        w = self.width
        return _now(w.auto and not w.settled)

    # -- threads ---------------------------------------------------------------------------------
    def _the_gate(self) -> Gate:
        """This process's gate, of the width now (one copied by fork has no threads: a new one)."""
        if self._gate is None or not self._gate.usable():
            self._gate = Gate(self.width.now)
            if self._on_running is not None:
                self._gate.report_running(self._on_running)
        else:
            self._gate.resize(self.width.now)
        return self._gate

    def start_ahead(self, key, load, items) -> None:
        """Starts loading `items` of the batch `key` (the worker's next task) through the gate,
        behind the batch loading now (its places free as its samples are done); ``map(...,
        key=key)`` takes them up. Only while a batch loads on threads (its width > 1)."""
        gate = self._the_gate()
        self._ahead[key] = [gate.submit(_call_with, (load, it)) for it in items]
        self._ahead_at[key] = self._now()

    def drop_ahead(self) -> None:
        """Forgets the batches started ahead (a new epoch: none is left to take them up): what
        has not started never does, what runs is waited for (nothing of an epoch loads in the
        next). In a copy made by fork they are only forgotten (their threads are the
        parent's)."""
        if self._gate is not None and not self._gate.usable():
            self._ahead.clear()  # (their futures' locks may be held by the parent's threads)
            self._ahead_at.clear()
            return
        for futures in self._ahead.values():
            for f in futures:
                f.cancel()
        for futures in self._ahead.values():
            for f in futures:
                if not f.cancelled():
                    f.exception()  # (waits; _call_with returns outcomes, never raises)
        self._ahead.clear()
        self._ahead_at.clear()

    # -- an event loop ---------------------------------------------------------------------------
    def run_async(self, load, items, n: int, progress=None) -> list:
        """`items` awaited on this worker's event loop, `n` at once (``Batch.outcomes``)."""
        if self._loop is None or self._pid != os.getpid():
            self._loop, self._pid = asyncio.new_event_loop(), os.getpid()
        gate = None

        async def one(it):
            async with gate:
                try:
                    value = load(it)
                    if inspect.isawaitable(value):
                        value = await value
                    return True, value, None
                except Exception as e:
                    return False, None, e
                finally:
                    if progress is not None:
                        progress()  # (the loop runs on this thread)

        async def every():
            nonlocal gate
            gate = asyncio.Semaphore(max(1, n))  # made on the running loop (3.9 binds at init)
            return await asyncio.gather(*(one(it) for it in items))

        return self._loop.run_until_complete(every())

    def close(self) -> None:
        for futures in self._ahead.values():
            for f in futures:
                f.cancel()
        self._ahead.clear()
        self._ahead_at.clear()
        if self._gate is not None and self._gate.usable():
            self._gate.close()
        self._gate = None
        if self._loop is not None and self._pid == os.getpid():
            self._loop.close()
        self._loop = None


class Batch:
    """One batch's items under way (``InFlight.start``). Iterating it yields, as each of its
    items loading on the gate's threads is done, how many places at the gate it leaves free
    (the width now less its items still loading): the worker loop, which owns what starts
    ahead, starts its next task's samples there (``InFlight.start_ahead``). Nothing is
    yielded for a batch that loads one at a time or on an event loop. ``outcomes()`` waits
    for what is left and returns ``[(ok, value, error)]`` in the items' order, once."""

    def __init__(self, fl: InFlight, load, items, n: int, serial: bool, progress, begin,
                 futures):
        self._fl = fl
        self._load = load
        self.items = items
        self._n = n
        self.serial = serial
        self._progress = progress
        self.begin = begin
        self._futures = futures  # on the gate's threads (None: loaded in outcomes())
        self._pending = None if futures is None else as_completed(futures)
        self._left = 0 if futures is None else len(futures)
        self._out: list | None = None

    def __iter__(self):
        while self._pending is not None and self._left > 0:
            next(self._pending)
            self._left -= 1
            if self._progress is not None:
                self._progress()
            yield self._fl.width.now - self._left

    def outcomes(self) -> list:
        if self._out is None:
            fl = self._fl
            if self._futures is not None:
                for _ in self:  # (what the caller did not wait for, counted as done)
                    pass
                self._out = [f.result() for f in self._futures]
            elif fl.is_async:
                self._out = fl.run_async(self._load, self.items, self._n, self._progress)
            else:
                self._out = fl.one_by_one(self._load, self.items, self._progress)
            fl.finished(self)
        return self._out


def _now(runqueue: bool = False) -> tuple[float, float, float]:
    """(wall clock, this process's CPU time, the seconds its threads waited on a run queue), in
    seconds; the last only with `runqueue` (while "auto" judges: it reads a file per thread),
    else 0 (and 0 where the kernel does not say)."""
    rq = _system.runqueue_seconds() if runqueue else None
    return time.monotonic(), time.process_time(), rq or 0.0


def _call(load, item):
    try:
        return True, load(item), None
    except Exception as e:
        return False, None, e


def _call_with(load_and_item):
    return _call(*load_and_item)


def resolve(value, loop_owner: InFlight | None = None):
    """A sample that is a coroutine (an async dataset loaded outside a batch: batch_size=None)
    awaited to its value, on `loop_owner`'s loop."""
    if not inspect.isawaitable(value):
        return value
    if loop_owner is None:
        return asyncio.run(_await(value))
    out = loop_owner.map(lambda _: value, [None], serial=True)[0]
    if not out[0]:
        raise out[2]
    return out[1]


async def _await(value):
    return await value
