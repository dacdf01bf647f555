"""The rank processes the pool serves: how many the job has on this machine, which joined, and
which of them ended (the pool watches each one's pidfd: a child of the rank holding a copy of
its socket cannot hide its end).

A rank is a process, not a connection: each epoch's iterator is a new connection of the same
rank, and the groups it joined keep batches for it until its process ends (streams.py).

Thread contract: none of its own; the pool calls it under ``Pool.lock``.
"""

from __future__ import annotations

import os

from ...common import system as _system
from . import wire


class Ranks:
    def __init__(self):
        self.expected = 0  # LOCAL_WORLD_SIZE, as the ranks said
        self._seen: set = set()  # the ranks that joined (their RANK, else their pid)
        # pid -> (a pidfd of it, -1 when it had ended, None when none could be opened; and the
        # groups it joined)
        self._procs: dict[int, tuple[int | None, set]] = {}

    def joined(self, rank, pid: int, ranks, group) -> int:
        """Rank `rank` (its RANK, or None) of process `pid`, in a job of `ranks` ranks on this
        machine, joined `group`: how many ranks have not joined yet."""
        self.expected = max(self.expected, int(ranks or 1))
        self._seen.add(rank if rank is not None else f"pid {pid}")
        known = self._procs.get(pid)
        if known is None:
            try:
                pidfd: int | None = os.pidfd_open(pid)
            except ProcessLookupError:
                pidfd = -1  # (it ended already)
            except OSError:  # (no descriptor free, say: its pid is checked instead)
                pidfd = None
            known = self._procs[pid] = (pidfd, set())
        known[1].add(group)
        return self.expected - len(self._seen)

    def ended(self) -> list:
        """(pid, the groups it joined) of each rank process that ended since the last call."""
        out = []
        for pid, (pidfd, groups) in list(self._procs.items()):
            if pidfd is None:
                if _system.process_state(pid) not in ("", "Z"):
                    continue
            elif pidfd >= 0:
                if not wire.readable(pidfd, 0):
                    continue
                os.close(pidfd)
            del self._procs[pid]
            out.append((pid, groups))
        return out
