"""Advice that tells waiting from computing: workers on a CPU, or waiting for one, less than
``WAITING_SHARE`` of the time they were busy mostly wait (storage, the network, a lock), and
more threads in each, not more processes, is what helps them. Waiting for a CPU (runnable, on
the kernel's run queue: ``system.runqueue_seconds``) is computing: on a machine whose cores are
all taken a worker that computes is on a CPU only part of the time, and more threads would only
make it wait longer. Workers that waited for a CPU ``CROWDED_SHARE`` of their busy time or more
are told that the CPUs are taken. Used by the data-stall notice and ``stoker doctor``.

Pure functions: safe from any thread.
"""

from __future__ import annotations

WAITING_SHARE = 0.5
# Workers that waited for a CPU this share of their busy time or more: the machine's CPUs are
# taken (on a machine with a core to spare, a worker waits a few percent at most).
CROWDED_SHARE = 0.25


def waiting(cpu_s, busy_s: float, runqueue_s=None) -> bool:
    """Whether workers that used `cpu_s` CPU seconds in `busy_s` seconds of work, and waited
    `runqueue_s` seconds for a CPU (None: not known), mostly wait."""
    return (cpu_s is not None and busy_s > 0
            and cpu_s + max(0.0, runqueue_s or 0.0) < WAITING_SHARE * busy_s)


def crowded(runqueue_s, busy_s: float) -> bool:
    """Whether workers that waited `runqueue_s` seconds for a CPU in `busy_s` seconds of work
    found the machine's CPUs taken."""
    return runqueue_s is not None and busy_s > 0 and runqueue_s >= CROWDED_SHARE * busy_s


def raise_threads(cpu_s: float, busy_s: float, threads=None) -> str:
    """The advice for workers that wait; `threads`: their ``threads_per_worker`` if known."""
    if threads == "auto":
        # "auto" widens up to the batch's size at most: a number can go past it
        what = ("threads_per_worker=\"auto\" stops at the batch's size; set a number above it "
                "(64, 128): the threads a batch leaves free load the next batch's samples")
    else:
        now = "" if threads in (None, 1) else f" (now {threads!r})"
        what = (f"Raise threads_per_worker{now} (16, 64, or \"auto\"): each worker then loads "
                "that many samples at once")
    return (f"The workers were on a CPU only {100 * min(1.0, cpu_s / busy_s):.0f}% of the time "
            "they were busy: they wait (on storage, the network, a lock) rather than compute, "
            f"so more processes would only wait too. {what}, with no more processes or memory; "
            "an async def __getitem__ runs that many on one event loop.")


def cpus_taken(cpu_s: float, runqueue_s: float, busy_s: float) -> str:
    """The advice for workers that compute but waited long for a CPU (``crowded``)."""
    on, queued = (100 * min(1.0, max(0.0, x) / busy_s) for x in (cpu_s, runqueue_s))
    return (f"The workers compute, but this machine's CPUs are taken: of the time they were busy "
            f"they were on a CPU {on:.0f}% and waited for one {queued:.0f}% (runnable, on the "
            "kernel's run queue). More workers or threads would only wait longer. Run fewer "
            "(num_workers=\"auto\" takes this process's share of the CPUs; threads_per_worker=1 "
            "for a dataset that computes), or find what else takes the cores: other ranks' "
            "workers or other jobs on this node (stoker doctor's \"workers on this machine\" "
            "check, top).")
