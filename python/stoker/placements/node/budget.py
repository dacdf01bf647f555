"""The node's bound on loading: at most ``limit`` pool workers load at once, across every group
of the pool (``Node(workers=N)``, or "auto": the usable CPUs less one per rank's loop).

A group may keep idle workers (one set per dataset, so a rank's loader starts at once), but a
worker loads only while it holds one of the budget's tokens: ``take`` before a task goes to a
worker, ``give`` when its outcome or its death came back. When no token is free, the group waits
in line; a token given back goes to the waiting group whose neediest rank has received the
fewest batches over the pool's life (every epoch and group: ``Pool.tally``; the rank furthest
behind, as inside a group), so ranks stay balanced whatever group they are in and however long
their epochs.

A worker with threads (``threads_per_worker``) holds one token: its threads wait on I/O in one
process, the bound is on the CPUs. Stream workers (an ``IterableDataset``'s) are their rank's
own, outside the pool; they do not hold tokens (docs/design/node.md).

Each pool worker's share of the CPUs (``worker_cpus``: the CPUs the pool may use, less one per
rank's loop, over the budget's limit) goes to it in ``LoadSettings.cpus``: the most threads
"auto" gives a worker that computes, where threads compute at once (a free-threaded Python).

Thread contract: ``worker_cpus`` is a plain function; every method, any thread; its lock is held only for its own counters, never
while a group's lock is taken, so a group may call it under its own lock. ``waiting`` returns
the groups in line; their ``dispatch`` is called by the caller with no lock held.
"""

from __future__ import annotations

import threading

from ...common import system as _system


def worker_cpus(limit: int, ranks: int) -> int:
    """The CPUs one of `limit` pool workers loading at once may keep busy: what the pool may use
    (its affinity and cgroup quota) less a core for each of the `ranks` training loops, divided
    among them; at least 1."""
    return max(1, (_system.usable_cpus() - max(1, int(ranks or 1))) // max(1, int(limit)))


class Budget:
    def __init__(self, limit: int):
        self.limit = max(1, int(limit))
        self._lock = threading.Lock()
        self._busy = 0
        self._waiting: dict = {}  # group -> how far behind its neediest rank is (batches)

    def take(self, group, behind: int) -> bool:
        """A token for one task of `group` (`behind`: the batches its neediest rank has
        received); False when none is free or a group further behind waits for one (then
        `group` waits in line)."""
        with self._lock:
            ahead = [b for g, b in self._waiting.items() if g is not group and b < behind]
            if self._busy < self.limit and len(ahead) < self.limit - self._busy:
                self._busy += 1
                self._waiting.pop(group, None)
                return True
            self._waiting[group] = behind
            return False

    def give(self) -> None:
        """A token comes back (its task's outcome or its worker's death)."""
        with self._lock:
            self._busy = max(0, self._busy - 1)

    def leave(self, group) -> None:
        """`group` no longer waits (it has nothing queued, or it ended)."""
        with self._lock:
            self._waiting.pop(group, None)

    def waiting(self) -> list:
        """The groups in line, furthest behind first, while a token is free."""
        with self._lock:
            if self._busy >= self.limit:
                return []
            return [g for g, _ in sorted(self._waiting.items(), key=lambda kv: kv[1])]
