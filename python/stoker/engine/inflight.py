"""Many samples in flight inside one worker: ``threads_per_worker`` (docs/design/threads.md).

A batch's samples are loaded at once by up to N threads of the worker (a pool made in the worker,
after it started), or, for an ``async def __getitem__``, as up to N coroutines on one event loop
of the worker. Either way the results come back in sampler order, so the batch is the one the
same loader builds with one thread; each sample goes through the error policy on its own
(``fetch.Fetcher`` decides what a failure means).

``threads_per_worker="auto"``: ``Width`` picks how many at once from what the batches before
measured (the second batch at each width): it widens while the samples per second rise and the
worker's CPU time stays well below its wall time (it waits on the network), and goes back to
the best width seen when widening did not pay. A dataset that computes keeps its CPU busy, so
"auto" leaves it at one thread (threads would only fight over the GIL).

Thread contract: ``InFlight`` belongs to the thread that loads (the worker's main thread); the
threads of its pool run only the sample loads handed to them, and call the dataset and the
per-sample callback (which must be thread-safe: the worker's is).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

from ..config.options import MAX_THREADS_PER_WORKER as MAX_THREADS

# "auto" doubles while the worker's CPU time is below this share of its wall time in the batch
WAITING_SHARE = 0.6
GAIN = 1.05  # ... and the samples per second rose by at least this factor
START = 4  # where "auto" starts: a batch of it tells waiting from computing
JUMP = 0.8  # a waiting worker widens to this share of what would keep its CPU busy


class Width:
    """How many samples of a batch load at once: fixed, or tuned ("auto") batch by batch.

    "auto" starts at START. After each batch it compares the worker's CPU time with the batch's
    wall time: a worker that computes in its first batch (CPU at least WAITING_SHARE of the wall
    time) goes to one thread and stays there; one that waits jumps by the share it waited (a worker on the CPU 5% of the time could run about 20
    times as many samples at once before its CPU is the limit; it takes JUMP of that), up to the
    batch's size, as long as each jump raised the samples per second by GAIN (once its CPU is
    busy it tries a doubling); a jump that did not pay goes back to the best width seen."""

    def __init__(self, setting):
        self.auto = setting == "auto"
        self.now = START if self.auto else int(setting)
        self._rate_at: dict[int, float] = {}
        self._before: int | None = None  # the width before the last jump
        self.settled = not self.auto
        self._size = 0  # the largest batch seen: only such batches judge a width
        # the first batch at a width pays for what the width is new to (connections opened,
        # threads started, imports): the next one measures it
        self._fresh = True

    def _best(self) -> int:
        return max(self._rate_at, key=self._rate_at.__getitem__)

    def observe(self, samples: int, wall_s: float, cpu_s: float) -> None:
        """One batch of `samples` took `wall_s`, of which the process spent `cpu_s` on CPU."""
        if self.settled or samples < 2 or wall_s <= 0:
            return
        self._size = max(self._size, samples)
        if samples < self._size:  # a short (last) batch: its rate is not the width's
            return
        if self._fresh:
            self._fresh = False
            return
        w = self.now
        rate = self._rate_at[w] = samples / wall_s
        if self._before is not None and rate < GAIN * self._rate_at[self._before]:
            self.now, self.settled = self._best(), True  # the last jump did not pay
            return
        computing = cpu_s >= WAITING_SHARE * wall_s
        if computing and len(self._rate_at) == 1:
            # its first batch kept the CPU busy: more threads would only share the GIL
            self.now, self.settled = 1, True
            return
        # a worker that waits jumps by the share it waited; one whose CPU is busy now tries
        # one doubling, which the samples per second then judge
        factor = 2 if computing else max(2, int(JUMP * wall_s / max(cpu_s, 1e-6)))
        wider = min(MAX_THREADS, samples, w * factor)
        if wider <= w:
            self.settled = True
            return
        self._before, self.now, self._fresh = w, wider, True


def is_async(dataset) -> bool:
    """Whether the dataset's __getitem__ or __getitems__ is an ``async def``."""
    for name in ("__getitem__", "__getitems__"):
        f = getattr(type(dataset), name, None)
        if f is not None and inspect.iscoroutinefunction(f):
            return True
    return False


class InFlight:
    """Loads items at once: ``map(load, items)`` returns ``[(ok, value, error)]`` in the items'
    order. `load(item)` returns the sample (or, for an async dataset, a coroutine for it) or
    raises; `ok` is False when it raised, `error` then holds the exception."""

    def __init__(self, dataset, setting, width: Width | None = None):
        """`width`: one kept from an earlier epoch's InFlight (what "auto" learnt)."""
        self.width = width if width is not None else Width(setting)
        self.is_async = is_async(dataset)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_size = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = os.getpid()

    @property
    def concurrent(self) -> bool:
        """Whether a batch's samples may load at once (else the caller loads them one by one,
        as before threads existed)."""
        return self.is_async or self.width.auto or self.width.now > 1

    def map(self, load, items, serial: bool = False, progress=None) -> list:
        """`serial`: one at a time whatever the width (a batch re-issued after its worker died
        with several samples in flight, so the death names the one that caused it);
        `progress(in_flight)` is called on this thread before the first item and as each is
        done, with how many load at once now (the worker's hang watch then times the wait for
        the next sample, not the whole batch)."""
        n = 1 if serial else min(self.width.now, len(items))
        if progress is not None:
            total, report = len(items), progress
            done = [0]

            def progress():
                report(min(n, total - done[0]))
                done[0] += 1

            progress()
        wall, cpu = time.monotonic(), time.process_time()
        if self.is_async:
            out = self._run_async(load, items, n, progress)
        elif n <= 1:
            out = []
            for it in items:
                out.append(_call(load, it))
                if progress is not None:
                    progress()
        else:
            out = self._run_threads(load, items, n, progress)
        if not serial:
            self.width.observe(len(items), time.monotonic() - wall, time.process_time() - cpu)
        return out

    # -- threads ---------------------------------------------------------------------------------
    def _threads(self, n: int) -> ThreadPoolExecutor:
        if self._pool is not None and (self._pool_size < n or self._pid != os.getpid()):
            if self._pid == os.getpid():
                self._pool.shutdown(wait=False)
            self._pool = None  # (a pool copied by fork has no threads: never used again)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(n, thread_name_prefix="stoker-sample")
            self._pool_size, self._pid = n, os.getpid()
        return self._pool

    def _run_threads(self, load, items, n: int, progress=None) -> list:
        pool = self._threads(n)
        if n < self._pool_size:  # a narrower width now ("auto"): at most n at once
            gate = threading.BoundedSemaphore(n)

            def gated(it):
                with gate:
                    return _call(load, it)

            futures = [pool.submit(gated, it) for it in items]
        else:
            futures = [pool.submit(_call, load, it) for it in items]
        if progress is not None:
            for _ in as_completed(futures):
                progress()
        return [f.result() for f in futures]

    # -- an event loop ---------------------------------------------------------------------------
    def _run_async(self, load, items, n: int, progress=None) -> list:
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
        if self._pool is not None and self._pid == os.getpid():
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = None
        if self._loop is not None and self._pid == os.getpid():
            self._loop.close()
        self._loop = None


def _call(load, item):
    try:
        return True, load(item), None
    except Exception as e:
        return False, None, e


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
