"""One window of what the iterator measured (``Window``) and what it says of one batch's costs:
the CPU the pipeline used (``pipeline_cpu_s``), whether the training loop was starved of CPU
(``starved``), the fewest workers that keep pace with it (``keeping_pace``), the count that
keeps up with it within the CPUs (``needed``), workers idle while it waited
(``idle_while_waiting``). Plain arithmetic on the numbers given; the tuner (``tuner.py``)
decides from them.

Thread contract: none (pure functions and a plain dataclass).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...common import advice as _advice

# the loop is starved of CPU when its threads waited on the run queue this share of the window
STARVED = 0.1
# idle worker-seconds, as a share of the seconds the loop waited (a line held by a slow batch
# gives 0.4 to 1; workers that are the bottleneck, under 0.1)
IDLE_SHARE = 0.3


@dataclass
class Window:
    """What happened during one window (seconds are wall-clock seconds of that window)."""

    seconds: float  # the window's length
    waited_s: float  # the loop waited for data this long
    main_cpu_s: float  # CPU the main process used (all its threads)
    worker_cpu_s: float  # CPU the active workers used
    worker_busy_s: float  # time the active workers spent loading, collating or encoding
    usable_cpus: int
    worker_rss: int  # the largest RSS of a worker (bytes), 0 when unknown
    slot_bytes_per_worker: int  # shared-memory slots mapped, per started worker
    memory_headroom: int | None  # bytes left before the limit (None: unknown)
    memory_limit: int | None
    workers: int = 0  # workers that took tasks (0: unknown)
    batches: int = 0  # batches the loop received during the window (0: unknown)
    # batches the active workers sent during the window (their status pages; 0: unknown). More
    # than the loop took while their queues fill (the first look): a worker's cost is per batch
    # it made
    made: int = 0
    first: bool = False  # the first look (see the module doc)
    slot_bytes: int = 0  # the mean size of one slot (one batch), 0 when none yet
    shared_memory_share: int | None = None  # max_shared_memory per worker (None: no cap)
    # seconds the main process's threads and the active workers' waited for a CPU (runnable, on
    # the kernel's run queue: the CPUs were taken); 0 where unknown
    main_runqueue_s: float = 0.0
    worker_runqueue_s: float = 0.0

    @property
    def worker_seconds(self) -> float:
        return self.workers * self.seconds



def pipeline_cpu_s(w) -> float:
    """The seconds the main process and the active workers were on a CPU or waiting for one
    (the run queue: computing, though the CPUs were taken)."""
    return w.main_cpu_s + w.worker_cpu_s + w.main_runqueue_s + w.worker_runqueue_s


def starved(w: Window) -> bool:
    """The training loop's threads waited on the run queue STARVED of the window or more."""
    return w.main_runqueue_s >= STARVED * w.seconds


def keeping_pace(w: Window) -> int:
    """The fewest workers that keep pace with a training loop starved of CPU (its threads on
    the run queue at least STARVED of the window): each needs no more CPU per batch than the
    loop itself, give or take STARVED (on cores of their own they deliver about as fast as it
    takes, and a loop that then waits for data a few percent lost more than that to them); a
    very large number when the loop is not starved or the workers mostly wait (on storage,
    the network: ``advice.waiting``), which takes little of its CPU, and CPU per batch would
    not say how fast they deliver. The workers' CPU per batch they sent, the loop's per batch
    it took (``made``, ``batches``: while the workers' queues fill they send more than it
    takes)."""
    if w.main_runqueue_s < STARVED * w.seconds or w.main_cpu_s <= 0 \
            or _advice.waiting(w.worker_cpu_s, w.worker_busy_s, w.worker_runqueue_s):
        return 1 << 30
    ratio = worker_cpu_per_batch(w) / (w.main_cpu_s / max(1, w.batches))
    return max(1, math.ceil(ratio / (1 + STARVED) - 1e-9))


def worker_cpu_per_batch(w: Window) -> float:
    """The active workers' CPU seconds per batch they sent (per batch the loop took where the
    window does not say what they sent)."""
    return w.worker_cpu_s / max(1, w.made or w.batches)


def needed(w: Window) -> int:
    """The workers that keep up with the loop within the CPUs, from one window's costs per
    batch: the loop takes a batch every `step` seconds of its own; `k` workers make one every
    busy/k; together they may use at most the usable CPUs (workers that wait on I/O use less
    CPU than busy time, and more of them fit; time waiting for a CPU counts as CPU: it does not
    wait on I/O). The loop's costs are per batch it took, the workers' per batch they sent."""
    n = max(1, w.batches)
    made = max(1, w.made or w.batches)
    busy = w.worker_busy_s / made
    step = max(1e-6, (w.seconds - w.waited_s) / n)
    # CPU seconds the pipeline spends on a batch, or waits for
    cpu = (w.main_cpu_s + w.main_runqueue_s) / n + (w.worker_cpu_s + w.worker_runqueue_s) / made
    rate = 1.0 / step
    if cpu > 0:
        rate = min(rate, w.usable_cpus / cpu)  # batches per second the CPUs allow
    return max(1, min(w.usable_cpus, math.ceil(busy * rate - 1e-9)))


def idle_while_waiting(w) -> bool:
    """The workers sat idle for at least IDLE_SHARE of the time the loop waited for data."""
    if w.worker_seconds <= 0 or w.waited_s <= 0:
        return False
    return w.worker_seconds - w.worker_busy_s >= IDLE_SHARE * w.waited_s
