"""Which ranks of a group build identical task streams (the ranks of a tensor-parallel group:
identical loaders), so that a batch one of them took is kept for the others until each took it.

A rank here is a process (its pid), not a connection: each epoch's iterator is a new connection,
and a rank still finishing epoch 0 will ask for epoch 1's batches on its next one. A rank's
stream in an epoch is known by the first task it sends in it (its base seed, epoch and index
list: ``Task.ident``): ranks whose first tasks are the same are peers for that epoch. Until a
rank has sent its first task of an epoch, it is taken for a peer of those it was a peer of in
its last epoch (it will most likely be again), or, new to the group, for a peer of everyone; the
moment its first task says otherwise, it no longer is, and what was kept for it is let go. Ranks
not yet attached at all are expected (``LATER``) while fewer ranks have joined the pool than the
job has on this machine (``LOCAL_WORLD_SIZE``), for at most ``EXPECT_S`` after the group's start.
A rank whose process ended is owed nothing.

Pure bookkeeping, no I/O: its owner (a ``Group``) calls it under its own lock.
"""

from __future__ import annotations

import time

# How long after a group starts a rank that has not attached yet may still be waited for (its
# interpreter importing torch on a busy machine): batches are kept for it that long at most.
EXPECT_S = 60.0
# The ranks not attached yet, as one owed party.
LATER = -1


class Streams:
    def __init__(self):
        self._first: dict[int, dict[tuple, tuple]] = {}  # rank -> {(seed, epoch): first ident}
        self._gone: set = set()  # ranks whose process ended (their streams still say who was
        #                          whose peer: what they took is kept for those)
        self._since = time.monotonic()
        self._expected = 0  # ranks that may still attach (the pool says)

    # -- what the group tells ------------------------------------------------------------------
    def attach(self, rank: int) -> None:
        self._first.setdefault(rank, {})
        self._gone.discard(rank)  # (a pid the kernel gave again: another process)

    def gone(self, rank: int) -> None:
        """`rank`'s process ended: it asks for nothing more."""
        self._gone.add(rank)

    def expect(self, more: int) -> None:
        """How many ranks of this job on this machine have not attached to the pool yet."""
        self._expected = max(0, more)

    def saw(self, rank: int, ident: tuple) -> bool:
        """`rank` sent a task; True when it is its first of its epoch (the peers may change)."""
        firsts = self._first.setdefault(rank, {})
        key = ident[:2]
        if key in firsts:
            return False
        firsts[key] = ident
        while len(firsts) > 4:  # (a training and a validation loader's last two epochs each)
            del firsts[next(iter(firsts))]
        return True

    # -- what it answers ------------------------------------------------------------------------
    def owed(self, ident: tuple, takers) -> set:
        """The ranks (and ``LATER``) expected to ask for the batch of `ident` besides `takers`,
        the ranks that took it."""
        key = ident[:2]
        streams = {self._first[t][key] for t in takers if key in self._first.get(t, {})}
        out: set = set()
        for r, firsts in self._first.items():
            if r in takers or r in self._gone:
                continue
            if key in firsts:
                if firsts[key] in streams:
                    out.add(r)
            elif not firsts or self._was_peer(r, takers):
                out.add(r)
        if self._later():
            out.add(LATER)
        return out

    def owed_now(self, held) -> set:
        """Who is still expected to ask for `held` (a ``ledger.Held``): of those it was owed,
        the ranks still peers of its takers; where ranks not attached yet were expected,
        whoever is now."""
        now = self.owed(held.ident, held.takers)
        return now if LATER in held.owed else held.owed & now

    def _later(self) -> bool:
        return bool(self._expected) and time.monotonic() - self._since < EXPECT_S

    def _was_peer(self, r: int, takers) -> bool:
        """`r` and one of `takers` were in the same stream the last epoch both took part in."""
        mine = self._first[r]
        for t in takers:
            theirs = self._first.get(t, {})
            shared = [key for key in mine if key in theirs]
            if shared and mine[shared[-1]] == theirs[shared[-1]]:
                return True
        return False
