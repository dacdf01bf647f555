"""Advice that tells waiting from computing: workers on a CPU less than ``WAITING_SHARE`` of the
time they were busy mostly wait (storage, the network, a lock), and more threads in each, not
more processes, is what helps them. Used by the data-stall notice and ``stoker doctor``.

Pure functions: safe from any thread.
"""

from __future__ import annotations

WAITING_SHARE = 0.5


def waiting(cpu_s, busy_s: float) -> bool:
    """Whether workers that used `cpu_s` CPU seconds in `busy_s` seconds of work mostly wait."""
    return cpu_s is not None and busy_s > 0 and cpu_s < WAITING_SHARE * busy_s


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
