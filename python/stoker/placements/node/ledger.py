"""The batches a group has sent to ranks and not yet got back: who holds each one, and who is
still expected to ask for it (``streams.Streams``), so that a batch is loaded once for every
rank of a tensor-parallel group whatever their timing.

A batch stays in its slot (lent: its worker writes elsewhere) while a rank holds it, and then,
with no holder, while a rank that builds the same task stream has not asked for it yet. Those
kept batches are bounded: at most ``keep_batches`` of them and ``keep_bytes`` in all per group
(the oldest goes first; the rank that then asks for it gets it loaded again, with the same
values), and none is kept longer than ``KEEP_S``. A rank whose process ends, or whose first task
of an epoch shows it is no peer, is owed nothing from then on. Views are held by connections
(one per iterator); what is owed is owed to ranks (processes: a rank asks for epoch 1 on its next
iterator's connection). A batch no one
holds or is owed goes back to its worker at once.

Pure bookkeeping: its owner (a ``Group``) calls it under its own lock. Forgetting a batch drops
the last reference to its lease, which gives the slot back (``PendingBatch.lend``).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import os
import time

from ...common import system as _system

# The most a batch no rank holds is kept for a rank that has not asked for it yet.
KEEP_S = 120.0
_ids = itertools.count(1)


def keep_bound() -> tuple[int, int]:
    """(batches, bytes) a group may keep for ranks that have not asked yet:
    ``STOKER_NODE_KEEP_MB`` (default: 1/16 of the memory this cgroup or machine has left now, at
    most 1 GiB) and 256 batches."""
    mb = os.environ.get("STOKER_NODE_KEEP_MB")
    if mb is not None:
        return 256, int(float(mb) * 2**20)
    avail = _system.memory_headroom()[0] or 2**34
    return 256, min(2**30, avail // 16)


@dataclasses.dataclass
class Held:
    """A batch the ranks were sent: its slot (``pending`` keeps the memfd open, ``lease`` keeps
    it lent), who holds it now, who got it, who is still expected to ask."""

    bid: int
    ident: tuple
    pending: object
    lease: object
    nbytes: int
    holders: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    takers: set = dataclasses.field(default_factory=set)  # ranks (pids) that got it
    owed: set = dataclasses.field(default_factory=set)  # ranks still expected to ask
    kept_since: float | None = None  # no holder since then: kept only for `owed`
    pid: int = 0  # the pool worker that loaded it


class Ledger:
    def __init__(self, keep_batches: int, keep_bytes: int):
        self.keep_batches, self.keep_bytes = keep_batches, keep_bytes
        self._by_id: dict[int, Held] = {}
        self._by_ident: dict[tuple, int] = {}
        self._kept: dict[int, None] = {}  # bids with no holder, oldest first
        self.kept_bytes = 0

    def add(self, ident: tuple, pending, owed: set, pid: int) -> Held:
        """A batch just loaded (by process `pid`), owed to `owed` besides those it is sent to."""
        held = Held(next(_ids), ident, pending, pending.lend(), pending.nbytes, owed=set(owed),
                    pid=pid)
        self._by_id[held.bid] = held
        self._by_ident[ident] = held.bid
        return held

    def find(self, ident: tuple) -> Held | None:
        bid = self._by_ident.get(ident)
        return self._by_id.get(bid) if bid is not None else None

    def gave(self, held: Held, cid: int, rank: int) -> None:
        """Connection `cid` of `rank` was sent `held` (it holds one more view of it)."""
        if held.kept_since is not None:
            self._unkeep(held)
        held.holders[cid] += 1
        held.takers.add(rank)
        held.owed.discard(rank)

    def release(self, bid: int, cid: int) -> None:
        held = self._by_id.get(bid)
        if held is not None and held.holders.get(cid, 0) > 0:
            held.holders[cid] -= 1
            if not held.holders[cid]:
                del held.holders[cid]  # (only holders with a count stay: `settle` tests it bare)
            self.settle(held)

    def settle(self, held: Held) -> None:
        """Keeps `held` while someone holds it or is owed it; else its slot goes back."""
        if held.holders:
            return
        if not held.owed:
            self._forget(held)
            return
        if held.kept_since is None:
            held.kept_since = time.monotonic()
            self._kept[held.bid] = None
            self.kept_bytes += held.nbytes
        while self._kept and (len(self._kept) > self.keep_batches
                              or self.kept_bytes > self.keep_bytes):
            self._forget(self._by_id[next(iter(self._kept))])

    def drop(self, cid: int) -> None:
        """Connection `cid` ended: it holds nothing (its rank may still be owed)."""
        for held in list(self._by_id.values()):
            if held.holders.pop(cid, None) is not None:
                self.settle(held)

    def not_owed(self, rank: int) -> None:
        """`rank` asks for nothing more (its process ended)."""
        for held in list(self._by_id.values()):
            if rank in held.owed:
                held.owed.discard(rank)
                self.settle(held)

    def recheck(self, owed_now) -> None:
        """Sets each batch's owed to ``owed_now(held)`` (a rank's first task showed it is no
        peer; a rank expected has attached), and lets go of batches kept past ``KEEP_S``."""
        now = time.monotonic()
        for held in list(self._by_id.values()):
            held.owed = owed_now(held)
            if held.kept_since is not None and now - held.kept_since > KEEP_S:
                held.owed.clear()
            self.settle(held)

    def clear(self) -> None:
        self._by_id.clear()
        self._by_ident.clear()
        self._kept.clear()
        self.kept_bytes = 0

    def _unkeep(self, held: Held) -> None:
        if self._kept.pop(held.bid, "gone") is None:
            self.kept_bytes -= held.nbytes
        held.kept_since = None

    def _forget(self, held: Held) -> None:
        if held.kept_since is not None:
            self._unkeep(held)
        self._by_id.pop(held.bid, None)
        if self._by_ident.get(held.ident) == held.bid:
            del self._by_ident[held.ident]
        # (the lease goes with the record: the slot is its worker's again)
