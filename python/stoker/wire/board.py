"""The loader's board: a page of shared memory other processes of the same user can read.

The main process keeps one sealed-size memfd per multi-process iterator ("stoker-board") and its
workers' status pages ("stoker-status") open; ``stoker top`` finds them by name in
``/proc/PID/fd`` and maps them read-only. Nothing is written to disk and nothing needs cleaning
up: the memory goes with the last process holding it. Every field is one aligned int64 written
by one process, so a reader never sees a torn value.

Thread contract: a ``Board`` is written by the thread that iterates (``set``/``add``) and closed
once, at the iterator's shutdown (any thread); readers are other processes.
"""

from __future__ import annotations

import mmap
import os
import secrets
import time

from .. import _stoker
from . import fdpass

BOARD_NAME = "stoker-board"
STATUS_NAME = "stoker-status"
MAGIC = 0x424F415244535450  # "BOARDSTP"

# Board fields (int64 each).
FIELDS = ("magic", "version", "token", "main_pid", "num_workers", "epoch", "batches_yielded",
          "waited_ns", "started_ns", "deaths", "skipped", "restarts",
          "active_workers",  # workers taking tasks now (tuned under num_workers="auto")
          "prefetch_factor",  # each worker's queue depth now; 0: not one depth (a node pool)
          "tuned")  # TUNED_WORKERS | TUNED_DEPTH: what the autotuner moves
F = {name: i for i, name in enumerate(FIELDS)}
TUNED_WORKERS, TUNED_DEPTH = 1, 2

# Worker status page (worker_status.h, WorkerStatusPage), uint64 each: names, order, magic and
# state names come from the C++ definitions through the extension.
STATUS_FIELDS = _stoker.STATUS_FIELDS
STATUS_MAGIC = _stoker.STATUS_MAGIC
STATES = _stoker.WORKER_STATES
NO_INDEX = _stoker.NO_INDEX


class Board:
    """Written by the main process only."""

    def __init__(self, num_workers: int, label: str = "", prefetch_factor: int = 0):
        """`label` (who serves the loader, e.g. "stoker.enable() DataLoaderShard") follows the
        name of the memfd, where ``stoker top`` reads it; `prefetch_factor`: each worker's
        queue depth (0 where there is not one, as in a node pool serving many ranks)."""
        self.token = secrets.randbits(62)
        name = f"{BOARD_NAME}:{label}"[:200] if label else BOARD_NAME
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC)
        os.ftruncate(self.fd, mmap.PAGESIZE)
        self.v = _stoker.map_shared(self.fd, len(FIELDS))
        self.v[:] = 0
        self.v[F["version"]] = 2  # 2: active_workers and prefetch_factor always set, tuned
        self.v[F["token"]] = self.token
        self.v[F["main_pid"]] = os.getpid()
        self.v[F["num_workers"]] = num_workers
        self.v[F["active_workers"]] = num_workers
        self.v[F["prefetch_factor"]] = prefetch_factor
        self.v[F["magic"]] = MAGIC
        fdpass.track(self.fd)  # a forked worker closes it

    def set(self, name: str, value) -> None:
        self.v[F[name]] = value

    def add(self, name: str, value=1) -> None:
        self.v[F[name]] += value

    def close(self) -> None:
        if self.fd >= 0:
            fdpass.untrack(self.fd)
            os.close(self.fd)
            self.fd = -1


def now_ns() -> int:
    return time.monotonic_ns()
