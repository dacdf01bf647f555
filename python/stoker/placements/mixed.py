"""Some workers local, the rest elsewhere: ``Ray(local_workers=k)`` runs worker ids ``0..k-1`` as
local processes and the others as actors. Each call goes to the placement that owns the id;
waiting takes events from both, the local ones first (they cost nothing to look at).

Thread contract: ``base.Workers``'s.
"""

from __future__ import annotations

import time

from .base import Hung, Workers

_LOCAL_SLICE_S = 0.002  # how long a local wait may hold up a look at the remote workers


class Mixed(Workers):
    def __init__(self, local, remote, split: int):
        self.local, self.remote, self.split = local, remote, split
        self.num_workers = local.num_workers
        self.start_method = f"{local.start_method} + {remote.start_method}"
        self.start_grace_s = max(local.start_grace_s, remote.start_grace_s)

    def _of(self, worker_id: int):
        return self.local if worker_id < self.split else self.remote

    def start(self, worker_id, config):
        self._of(worker_id).start(worker_id, config)

    def start_all(self, count, config):
        self.local.start_all(min(count, self.split), config)
        for w in range(self.split, count):
            self.remote.start(w, config)

    def stop(self, worker_id):
        self._of(worker_id).stop(worker_id)

    def kill(self, worker_id, hung: Hung):
        self._of(worker_id).kill(worker_id, hung)

    def shutdown(self):
        try:
            self.local.shutdown()
        finally:
            self.remote.shutdown()

    def send_task(self, worker_id, task, index):
        return self._of(worker_id).send_task(worker_id, task, index)

    def set_memory_share(self, worker_id, nbytes):
        return self._of(worker_id).set_memory_share(worker_id, nbytes)

    def begin_epoch(self, worker_id, epoch, payload):
        return self._of(worker_id).begin_epoch(worker_id, epoch, payload)

    def wait(self, timeout_s):
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            ev = self.local.wait(0.0)
            if ev is not None:
                return ev
            ev = self.remote.wait(0.0)
            if ev is not None:
                return ev
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            ev = self.local.wait(_LOCAL_SLICE_S if left is None else min(_LOCAL_SLICE_S, left))
            if ev is not None:
                return ev

    def has(self, worker_id):
        return self._of(worker_id).has(worker_id)

    def pid(self, worker_id):
        return self._of(worker_id).pid(worker_id)

    def status(self, worker_id):
        return self._of(worker_id).status(worker_id)

    def is_stopped(self, worker_id):
        return self._of(worker_id).is_stopped(worker_id)

    def started_at(self, worker_id):
        return self._of(worker_id).started_at(worker_id)

    def last_sent(self, worker_id):
        return self._of(worker_id).last_sent(worker_id)

    def capture_stack(self, worker_id):
        return self._of(worker_id).capture_stack(worker_id)

    def cpu_seconds(self, worker_id):
        return self._of(worker_id).cpu_seconds(worker_id)

    def slot_usage(self):
        a, b = self.local.slot_usage(), self.remote.slot_usage()
        return {k: a.get(k, 0) + b.get(k, 0) for k in set(a) | set(b)}

    def stats(self):
        return ([e for e in self.local.stats() if e["id"] < self.split]
                + [e for e in self.remote.stats() if e["id"] >= self.split])

    def config_changed(self, config):
        self.local.config_changed(config)
        self.remote.config_changed(config)

    def scale_hint(self) -> str:
        return self.remote.scale_hint()

    @property
    def processes(self):
        return self.local.processes
