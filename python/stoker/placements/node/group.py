"""One dataset's workers in the node's pool, shared by every rank's iterator that loads it.

A ``Group`` is made for the first rank that asks with a given key (the hash of the dataset's,
``collate_fn``'s and ``worker_init_fn``'s pickled bytes and of the options that change what a
worker returns), from the sealed memfd that rank sent: every worker of the group maps it, so the
node holds one copy of the dataset's pickle however many ranks use it. The workers are the local
placement's own processes (``LocalProcesses`` under forkserver, the pool having threads), so
they are started, watched and named exactly as a rank's own workers would be.

Scheduling: each rank's iterator (a *client*) queues tasks; a worker that is free takes the next
task of the client that has received the fewest batches (the rank furthest behind), one task per
worker at a time, so a worker's death concerns the one task it was loading. Before a task, a
worker is set to the task's base seed and epoch (a ``MSG_RESUME``), and seeds each sample from
them (``seed="per_sample"``): a sample's values do not depend on which worker loaded it.

Loaded once: a task identical to one queued, running or still held by a rank (same base seed,
epoch and indices: the ranks of a tensor-parallel group) is not loaded again; the one batch is
sent to every rank that asked, and its slot is freed when the last of them let go of it.

Deaths: a worker that dies is started again at once; the ranks that asked for its task get a
``died`` for the virtual worker they sent it to, with the death's names, and the pool forgets
every other task of those virtual workers (the rank's own supervision re-issues them, exactly
once, under its own policy). A worker that dies three times in a row before its first sample
marks the group as broken: every task is then answered with that death.

Thread contract: every method runs under the pool's lock (``Pool.lock``), except ``run``, the
group's own thread, which waits on the workers without it and takes it for each event.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import itertools
import logging
import multiprocessing
import signal
import threading
import time

from ...engine import deaths, events, protocol
from ...engine.board import Board
from ..base import STARTUP_GRACE_S, Hung
from ..local import LocalProcesses

log = logging.getLogger("stoker")

# A start-up that raises (an unpicklable class, a worker_init_fn that fails: deterministic) three
# times in a row breaks the group. A worker killed by a signal while starting (the OOM killer
# choosing the newest process, an operator, a chaos test) says nothing of its next start: it is
# started again, after a growing pause when it keeps dying (never a hot loop), and the group
# breaks only when no worker of it has loaded anything for STARTUP_GRACE_S through at least
# START_KILLS_BROKEN such deaths (a crash at every import).
START_DEATHS_BROKEN = 3
START_KILLS_BROKEN = 10
# How long a batch no rank holds stays in its slot, in a group whose ranks ask for the same
# batches, for the ranks that have not asked yet (at most two per worker stay).
LINGER_BATCH_S = 2.0
_ids = itertools.count(1)


def _forkserver():
    """The fork server the pool's workers start from, with the engine (and so torch) imported
    once in it: its default preload, ``__main__``, is nothing for a pool run with ``-m``, and
    every worker (every restart after a death) would import torch anew, for seconds."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["stoker.engine.process", "stoker.placements.local"])
    return ctx


@dataclasses.dataclass
class Asker:
    """One rank's request for a task: its connection, virtual worker, that worker's
    incarnation, and the task's number in that rank's iterator."""

    cid: int
    w: int
    gen: int
    task: int


@dataclasses.dataclass
class Task:
    ident: tuple  # (base seed, epoch, index format, index bytes)
    fmt: int
    payload: bytes
    askers: list
    number: int = dataclasses.field(default_factory=lambda: next(_ids))
    worker: int | None = None  # the pool worker loading it
    began: bool = False  # the ranks heard that a started worker took it
    sent_at: float = 0.0  # when it went to its worker
    killed: bool = False  # its worker was killed for not finishing its start-up
    # a rank re-issued it after a death with its samples in flight (protocol.ONE_AT_A_TIME)
    one_at_a_time: bool = False


@dataclasses.dataclass
class Held:
    """A batch sent to ranks and not yet let go by all of them."""

    pending: object  # the PendingBatch (keeps the slot's memfd open)
    lease: object  # keeps the slot lent
    ident: tuple
    holders: collections.Counter


class Group:
    def __init__(self, pool, key: str, config, sealed, size: int):
        self.pool = pool
        self.key = key
        self.size = size
        self.config = config
        self._sealed = sealed
        # A board of its own: `stoker top` and `stoker doctor` see the pool and its workers
        # (their status pages carry its token), counted once for every rank it serves.
        self.board = Board(size, f"stoker node pool {pool.job}")
        self.workers = LocalProcesses(_forkserver(), size, self.board.token, sealed=sealed,
                                      keep_slot_fds=True)
        self.clients: set[int] = set()
        self.idle_since = time.monotonic()
        self.broken: events.WorkerExited | None = None
        self._queues: dict[int, collections.deque] = {}  # client -> its tasks not yet running
        self._delivered: collections.Counter = collections.Counter()  # client -> batches
        self._running: dict[int, Task | None] = {}  # pool worker -> the task it loads
        self._seed: dict[int, tuple] = {}  # pool worker -> (base seed, epoch) it is set to
        self._start_deaths: collections.Counter = collections.Counter()  # raised: exited
        self._start_kills: collections.Counter = collections.Counter()  # killed by a signal
        self._restart_at: dict[int, float] = {}  # worker -> when it starts again (a pause)
        self._progress_at = time.monotonic()  # the group's last outcome
        self._by_ident: dict[tuple, Task] = {}  # queued or running
        self._held: dict[int, Held] = {}  # batch id -> what holds it
        self._held_by_ident: dict[tuple, int] = {}
        self._lingering: dict[int, float] = {}  # batch id -> until when it stays (no holder)
        self.shared_seen = False  # two ranks asked for one batch: the group's ranks share
        self._forgotten: dict[tuple, int] = {}  # (client, w) -> the incarnation that died
        self._closed = False
        for w in range(size):
            self._start(w)
        self._thread = threading.Thread(target=self.run, name=f"stoker-node-group-{key[:8]}",
                                        daemon=True)
        self._thread.start()

    # -- workers ---------------------------------------------------------------------------------
    def _start(self, w: int) -> None:
        self.workers.start(w, self.config)
        self._running[w] = None
        self._seed[w] = (self.config.seeder.base_seed, self.config.seeder.epoch)

    def pids(self) -> list:
        return [p.pid for p in self.workers.processes]

    def run(self) -> None:
        """The group's thread: each event of its workers, under the pool's lock."""
        while True:
            with self.pool.lock:
                if self._closed:
                    return
            try:
                ev = self.workers.wait(0.2)
            except Exception as e:
                with self.pool.lock:
                    if self._closed:  # the workers were shut down under it
                        return
                    log.exception("stoker node pool: group %s failed", self.key[:8])
                    self._fail(e)
                time.sleep(0.2)
                continue
            with self.pool.lock:
                if self._closed:
                    if isinstance(ev, events.BatchReady):
                        ev.batch.discard()
                    return
                try:
                    if isinstance(ev, events.WorkerExited):
                        self._died(ev)
                    elif ev is not None:
                        self._event(ev)
                    self._expire_lingering()
                    self._start_due()
                    self.dispatch()
                    for t in self._running.values():  # workers that finished starting since
                        if t is not None and not t.began:
                            self._tell_began(t)
                            self._stuck_starting(t)
                except Exception as e:  # never a silent stop: every rank waiting hears of it
                    log.exception("stoker node pool: group %s failed", self.key[:8])
                    self._fail(e)

    def _event(self, ev) -> None:
        if isinstance(ev, events.EpochBegun):
            return  # the seed set before a task (dispatch)
        task = self._running.get(ev.worker)
        if task is None or task.number != ev.task:
            if isinstance(ev, events.BatchReady):
                ev.batch.discard()
            return
        if events.is_outcome(ev):
            self._running[ev.worker] = None
            self._by_ident.pop(task.ident, None)
            self._start_deaths.pop(ev.worker, None)
            self._start_kills.pop(ev.worker, None)
            self._progress_at = time.monotonic()
            self.board.add("batches_yielded")
        if isinstance(ev, events.BatchReady):
            self._deliver(task, ev.batch)
            return
        for a in task.askers:
            out = copy.copy(ev)
            out.worker, out.task = a.w, a.task
            self.pool.send(a.cid, ("ev", a.w, a.gen, out))
            if events.is_outcome(ev):
                self._delivered[a.cid] += 1

    def _deliver(self, task: Task, pending) -> None:
        if not task.askers:
            pending.discard()
            return
        lease = pending.lend()
        held = Held(pending, lease, task.ident, collections.Counter())
        bid = next(_ids)
        self._held[bid] = held
        self._held_by_ident[task.ident] = bid
        for a in task.askers:
            self._send_batch(bid, held, a)
        self._let_go_if_free(bid)

    def _send_batch(self, bid: int, held: Held, a: Asker) -> None:
        ok = self.pool.send(a.cid, ("batch", a.w, a.gen, a.task, bid, held.pending.offset,
                                    held.pending.nbytes), [held.pending.fd])
        if ok:
            held.holders[a.cid] += 1
            self._delivered[a.cid] += 1

    def _let_go_if_free(self, bid: int) -> None:
        held = self._held.get(bid)
        if held is None or +held.holders:
            return
        if self.shared_seen and bid not in self._lingering:
            # Ranks of this group ask for the same batches (a tensor-parallel group): the
            # others may not have asked yet (a batch small enough to be copied out is let go
            # at once), so it stays a moment before its slot goes back.
            self._lingering[bid] = time.monotonic() + LINGER_BATCH_S
            while len(self._lingering) > max(2, 2 * self.size):
                self._forget_batch(next(iter(self._lingering)))
            return
        self._forget_batch(bid)

    def _forget_batch(self, bid: int) -> None:
        self._lingering.pop(bid, None)
        held = self._held.pop(bid, None)
        if held is not None and self._held_by_ident.get(held.ident) == bid:
            del self._held_by_ident[held.ident]
        # the lease goes with it: the slot is free for its worker's next batch

    def _expire_lingering(self) -> None:
        now = time.monotonic()
        for bid, until in list(self._lingering.items()):
            held = self._held.get(bid)
            if until <= now and (held is None or not +held.holders):
                self._forget_batch(bid)

    def release(self, cid: int, bid: int) -> None:
        held = self._held.get(bid)
        if held is not None and held.holders[cid] > 0:
            held.holders[cid] -= 1
            self._let_go_if_free(bid)

    def _died(self, ev: events.WorkerExited) -> None:
        w = ev.worker
        task = self._running.get(w)
        self._running[w] = None
        if not ev.started:
            if ev.signum:
                self._start_kills[w] += 1
            else:
                self._start_deaths[w] += 1
        failing = self._start_deaths[w] >= START_DEATHS_BROKEN or (
            sum(self._start_kills.values()) >= START_KILLS_BROKEN
            and time.monotonic() - self._progress_at > STARTUP_GRACE_S)
        if failing:  # the ranks must not start it again: the pool did, and it kept failing
            ev = dataclasses.replace(ev, start_failed=True)
        if task is not None:
            if not ev.started and task.askers and not failing:
                # It died starting (the OOM killer choosing the newest process, say), before
                # it loaded anything of the task: the task waits for another worker; the ranks
                # hear only of a start-up that keeps failing (the group breaks, below).
                task.worker, task.began, task.killed = None, False, False
                self._queues.setdefault(task.askers[0].cid, collections.deque()).appendleft(
                    task)
                task = None
        if task is not None:
            self._by_ident.pop(task.ident, None)
            for a in list(task.askers):
                self._tell_death(a, ev)
        if failing and self.broken is None:
            log.warning("stoker node pool: group %s is broken: %s", self.key[:8], ev.cause)
            self.broken = ev
            for t in list(self._by_ident.values()):
                for a in list(t.askers):
                    self._tell_death(a, ev)
        if self.broken is None:
            k = self._start_kills[w] if not ev.started else 0
            if k > 3:  # 0.1 s, 0.2 s, ... at most 2 s between starts
                self._restart_at[w] = time.monotonic() + min(2.0, 0.1 * 2 ** (k - 4))
            else:
                self._start(w)

    def _start_due(self) -> None:
        """Starts the workers whose pause after deaths at start-up is over."""
        now = time.monotonic()
        for w, at in list(self._restart_at.items()):
            if at <= now:
                del self._restart_at[w]
                if self.broken is None:
                    self._start(w)

    def _fail(self, error: BaseException) -> None:
        """The group cannot go on (its workers could not be started again, a slot was found
        overwritten): it is broken, and every rank waiting on it is told, with the error."""
        cause = (f"was lost with the node pool's workers for this dataset: "
                 f"{type(error).__name__}: {protocol.safe_str(error)}")
        ev = events.WorkerExited(-1, None, 0, None, cause, f"a worker {cause}", None, False,
                                 False, True, False, start_failed=True)
        self.broken = self.broken or ev
        for t in list(self._by_ident.values()):
            for a in list(t.askers):
                self._tell_death(a, self.broken)

    def _tell_death(self, a: Asker, ev: events.WorkerExited) -> None:
        """The rank's virtual worker `a.w` is told that a pool worker died on its task; the pool
        forgets every other task of that incarnation (the rank re-issues them)."""
        if self._forgotten.get((a.cid, a.w), -1) >= a.gen:
            return
        out = dataclasses.replace(ev, worker=a.w, task=a.task if ev.task is not None else None)
        self.pool.send(a.cid, ("died", a.w, a.gen, out))
        self.forget(a.cid, a.w, a.gen)

    def forget(self, cid: int, w: int, gen: int) -> None:
        """Drops every task of the rank's virtual worker `w` up to incarnation `gen`."""
        self._forgotten[(cid, w)] = max(gen, self._forgotten.get((cid, w), -1))

        def mine(a):
            return a.cid == cid and a.w == w and a.gen <= gen

        for t in list(self._by_ident.values()):
            t.askers = [a for a in t.askers if not mine(a)]
        q = self._queues.get(cid)
        if q is not None:
            kept = [t for t in q if t.askers]
            q.clear()
            q.extend(kept)
            for t in list(self._by_ident.values()):
                if not t.askers and t.worker is None:
                    self._by_ident.pop(t.ident, None)

    # -- clients ---------------------------------------------------------------------------------
    def attach(self, cid: int) -> None:
        self.clients.add(cid)
        self._queues[cid] = collections.deque()

    def detach(self, cid: int) -> None:
        """The client's connection ended: its tasks are dropped, its batches let go."""
        self.clients.discard(cid)
        for t in list(self._by_ident.values()):
            t.askers = [a for a in t.askers if a.cid != cid]
            if not t.askers and t.worker is None:
                self._by_ident.pop(t.ident, None)
        for t in self._queues.pop(cid, ()):
            if t.askers:  # another rank joined it: it waits in that rank's queue now
                self._queues.setdefault(t.askers[0].cid, collections.deque()).append(t)
        self._delivered.pop(cid, None)
        for bid, held in list(self._held.items()):
            held.holders.pop(cid, None)
            self._let_go_if_free(bid)
        for key in [k for k in self._forgotten if k[0] == cid]:
            del self._forgotten[key]
        if not self.clients:
            self.idle_since = time.monotonic()

    def add_task(self, cid: int, w: int, gen: int, task: int, fmt: int, payload: bytes,
                 base_seed: int, epoch: int) -> None:
        if self._forgotten.get((cid, w), -1) >= gen:
            return  # sent before the rank heard of its worker's death: it re-issues it
        a = Asker(cid, w, gen, task)
        if self.broken is not None:
            self._tell_death(a, self.broken)
            return
        one_at_a_time = bool(fmt & protocol.ONE_AT_A_TIME)
        fmt &= ~protocol.ONE_AT_A_TIME  # (the same batch, however its samples load)
        ident = (base_seed, epoch, fmt, payload)
        bid = self._held_by_ident.get(ident)
        if bid is not None:  # another rank of the group has it: the same slot
            self.shared_seen = True
            self._lingering.pop(bid, None)
            self._send_batch(bid, self._held[bid], a)
            self._let_go_if_free(bid)  # (when that send found the rank gone)
            return
        same = self._by_ident.get(ident)
        if same is not None:
            self.shared_seen = self.shared_seen or any(x.cid != cid for x in same.askers)
            same.askers.append(a)
            same.one_at_a_time = same.one_at_a_time or one_at_a_time
            return
        t = Task(ident, fmt, payload, [a], one_at_a_time=one_at_a_time)
        self._by_ident[ident] = t
        self._queues[cid].append(t)
        self.dispatch()

    def kill_targets(self, cid: int, w: int, gen: int, hung) -> list:
        """The rank's hang watch gave up on its virtual worker `w`: the pool workers loading
        its tasks, to be killed by ``kill`` (without the pool's lock). When none is (its task
        ended meanwhile, or no worker ever took it), the rank is told of the death at once, so
        that it re-issues the work: a kill always ends in a death."""
        out = []
        for pw, t in self._running.items():
            if t is not None and any(a.cid == cid and a.w == w and a.gen == gen
                                     for a in t.askers):
                v = self.workers.view(pw)
                st = (v.status if v is not None else None) or {}
                named = hung
                if named.index is None and st.get("index") is not None:
                    named = dataclasses.replace(named, index=st["index"])
                out.append((pw, named))
        if not out:
            cause, explanation = deaths.describe_hang(hung.seconds, hung.stack,
                                                      index=hung.index, stuck=hung.stuck)
            self._tell_death(Asker(cid, w, gen, -1), events.WorkerExited(
                w, None, signal.SIGKILL, None, cause, explanation, hung.index, False, True,
                True, False))
        return out

    def kill(self, targets: list) -> None:
        for pw, named in targets:
            if not named.stack:
                named = dataclasses.replace(named, stack=self.workers.capture_stack(pw))
            self.workers.kill(pw, named)

    def dispatch(self) -> None:
        """Every free worker takes the next task of the rank furthest behind."""
        for pw, running in self._running.items():
            if running is not None or pw in self._restart_at:
                continue
            task = self._next_task()
            if task is None:
                return
            base_seed, epoch = task.ident[0], task.ident[1]
            if self._seed.get(pw) != (base_seed, epoch):
                self.workers.begin_epoch(pw, epoch, protocol.encode_resume(base_seed, None))
                self._seed[pw] = (base_seed, epoch)
            task.worker = pw
            task.sent_at = time.monotonic()
            self._running[pw] = task
            self._tell_began(task)
            if not self.workers.send_task(pw, task.number,
                                          protocol.decode_index(task.fmt, task.payload),
                                          task.one_at_a_time):
                self._running[pw] = None  # its death is on its way; the task waits for another
                task.worker = None
                self._queues.setdefault(task.askers[0].cid, collections.deque()).appendleft(task)

    def _tell_began(self, task: Task) -> None:
        """The ranks that asked for `task` hear when a worker past its start-up takes it: their
        hang watch times a sample from then (a worker still importing is not hung)."""
        v = self.workers.view(task.worker)
        st = v.status if v is not None else None
        if task.began or st is None or st.get("state") == "starting":
            return
        task.began = True
        for a in task.askers:
            self.pool.send(a.cid, ("began", a.w, a.gen, a.task))

    def _stuck_starting(self, task: Task) -> None:
        """A worker that has not finished starting (a deadlocked worker_init_fn, an import
        that never returns) long after it was given a task is killed as a local iterator's
        hang watch would: its death, named so, reaches the ranks that wait."""
        waited = time.monotonic() - task.sent_at
        if task.began or task.killed or waited <= STARTUP_GRACE_S:
            return
        task.killed = True
        stuck = (f"pool worker {task.worker} has not finished starting {waited:.0f} s after it "
                 "was given a task (a slow or deadlocked import or worker_init_fn)")
        self.workers.kill(task.worker, Hung(None, waited, self.workers.capture_stack(
            task.worker), stuck=stuck))

    def _next_task(self) -> Task | None:
        order = sorted((self._delivered[c], c) for c, q in self._queues.items() if q)
        for _, c in order:
            q = self._queues[c]
            while q:
                t = q.popleft()
                if t.askers:
                    return t
                if self._by_ident.get(t.ident) is t:
                    del self._by_ident[t.ident]
        return None

    # -- ending ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Marks the group ended (the pool's lock held): its thread sees it and returns."""
        self._closed = True
        self._held.clear()
        self._held_by_ident.clear()
        self._lingering.clear()

    def end(self) -> None:
        """Ends the workers and waits for the thread, after ``close`` (without the pool's
        lock: a worker may take a moment to be reaped)."""
        self.workers.shutdown()
        self._thread.join()
        self._sealed.close()
        self.board.close()
