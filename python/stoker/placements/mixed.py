"""Some workers local, the rest elsewhere: ``Ray(local_workers=k)`` runs worker ids ``0..k-1`` as
local processes and the others as actors. A router: each call about one worker goes to the
placement that owns its id; waiting takes events from both, the local ones first (they cost
nothing to look at); reports are built by ``Workers`` from the routed reads.

Thread contract: ``base.Workers``'s.
"""

from __future__ import annotations

import time

from .base import Workers

_LOCAL_SLICE_S = 0.002  # how long a local wait may hold up a look at the remote workers


def _routed(name: str):
    """``Workers.<name>(worker_id, ...)``, sent to the placement that owns `worker_id`."""

    def call(self, worker_id, *args):
        return getattr(self._of(worker_id), name)(worker_id, *args)

    call.__name__, call.__doc__ = name, getattr(Workers, name).__doc__
    return call


class Mixed(Workers):
    start, stop, kill = _routed("start"), _routed("stop"), _routed("kill")
    send_task, begin_epoch = _routed("send_task"), _routed("begin_epoch")
    set_memory_share, view = _routed("set_memory_share"), _routed("view")
    capture_stack, where = _routed("capture_stack"), _routed("where")
    runqueue_of, schedstat_of = _routed("runqueue_of"), _routed("schedstat_of")

    def __init__(self, local: Workers, remote: Workers, split: int):
        self.local, self.remote, self.split = local, remote, split
        self.num_workers = local.num_workers
        self.start_method = f"{local.start_method} + {remote.start_method}"
        self.start_grace_s = max(local.start_grace_s, remote.start_grace_s)

    def _of(self, worker_id: int) -> Workers:
        return self.local if worker_id < self.split else self.remote

    def start_all(self, count, config):
        self.local.start_all(min(count, self.split), config)  # (its warnings before forking)
        for w in range(self.split, count):
            self.remote.start(w, config)

    def wait(self, timeout_s):
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            ev = self.local.wait(0.0) or self.remote.wait(0.0)
            left = None if deadline is None else deadline - time.monotonic()
            if ev is None and (left is None or left > 0):
                ev = self.local.wait(_LOCAL_SLICE_S if left is None else min(_LOCAL_SLICE_S, left))
            if ev is not None or (left is not None and left <= 0):
                return ev

    def slot_usage(self):
        a, b = self.local.slot_usage(), self.remote.slot_usage()
        return {k: a.get(k, 0) + b.get(k, 0) for k in set(a) | set(b)}

    def config_changed(self, config):
        self.local.config_changed(config)
        self.remote.config_changed(config)

    def shutdown(self):
        try:
            self.local.shutdown()
        finally:
            self.remote.shutdown()

    def scale_hint(self) -> str:
        return self.remote.scale_hint()

    def cpus_per_worker(self) -> int:
        """One config for both: the smaller share (a local worker's and an actor's)."""
        return min(self.local.cpus_per_worker(), self.remote.cpus_per_worker())

    @property
    def processes(self):
        return self.local.processes
