"""One dataset's workers in the node's pool, shared by every rank's iterator that loads it.

Made for the first rank that asks with a key (hello.py), from its sealed memfd. Its workers are
given to it (server.py builds ``LocalProcesses``, forked from the pool's template; a test, a
fake with the same methods); its thread waits on them once ``start`` is called. Its state is
records: a ``PoolWorker``, ``Client`` and ``Task`` each (records.py), the ``Ledger`` of batches
sent (ledger.py), the ``Streams`` that say which ranks are peers (streams.py). The rules are
docs/design/node.md's (workers started as tasks need them, the node's ``Budget``, the rank
furthest behind first, batches kept for peers, deaths told to the ranks that asked, a group
broken by failed starts).

Thread contract: every method takes the group's own ``lock`` (re-entrant), which nothing else
needs; its thread waits on workers without it. A process is started under this lock only (a
fork of the template: milliseconds). ``kill`` runs without it (it waits up to a second for a
stack). Messages to ranks go through ``pool.send`` (it only queues).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import threading
import time

from ...wire import events, fdpass, protocol
from ..base import STARTUP_GRACE_S, Hung
from . import deaths, wire
from .ledger import Ledger, keep_bound
from .records import Asker, Client, PoolWorker, Task, breaks_group
from .streams import Streams

log = logging.getLogger("stoker")

RECHECK_S = 0.5  # how often kept batches are looked at again (their age, who is still owed)


class Group:
    """`workers` (``LocalProcesses``, or anything with its methods) and `board` (whose token
    they carry) are the group's from here on; nothing runs until ``start``."""

    def __init__(self, pool, key: str, config, sealed, budget, workers, board, stdio=()):
        self.pool = pool
        self.key = key
        self._stdio = list(stdio)  # the first rank's stdout, stderr: where its workers print
        if len(self._stdio) == 2:
            config.stdio = tuple(fdpass.ChannelFd(fd) for fd in self._stdio)
        self.config = config
        self.budget = budget
        self.lock = threading.RLock()
        self._sealed = sealed
        self.board = board
        self.workers = workers
        self._slots = [PoolWorker(i) for i in range(workers.num_workers)]
        self._clients: dict[int, Client] = {}
        self._tasks: dict[tuple, Task] = {}  # queued or running, by identity
        self.ledger = Ledger(*keep_bound())
        self.streams = Streams()
        self.idle_since = time.monotonic()
        self.broken: events.WorkerExited | None = None
        self._progress_at = time.monotonic()  # the group's last outcome
        self._checked_at = 0.0
        self._closed = False
        self._thread = threading.Thread(target=self.run, name=f"stoker-node-group-{key[:8]}",
                                        daemon=True)

    def start(self) -> None:
        """Starts the thread that waits on the workers (they start as tasks need them)."""
        self._thread.start()

    # -- reads -----------------------------------------------------------------------------------
    @property
    def clients(self) -> int:
        with self.lock:
            return len(self._clients)

    def pids(self) -> list:  # the group's live workers', by slot
        with self.lock:
            return [pw.pid for pw in self._slots if pw.alive]

    # -- the group's thread ----------------------------------------------------------------------
    def run(self) -> None:
        """Each event of the group's workers, handled under its lock; then tokens given back
        go to whichever group is furthest behind (``pool.wake``, with no lock held)."""
        while True:
            with self.lock:
                if self._closed:
                    return
            try:
                ev = self.workers.wait(0.2)
            except Exception as e:
                with self.lock:
                    if self._closed:  # the workers were shut down under it
                        return
                    log.exception("stoker node pool: group %s failed", self.key[:8])
                    self._fail(e)
                time.sleep(0.2)
                continue
            with self.lock:
                if self._closed:
                    if isinstance(ev, events.BatchReady):
                        ev.batch.discard()
                    return
                try:
                    if isinstance(ev, events.WorkerExited):
                        self._died(ev)
                    elif ev is not None:
                        self._event(ev)
                    self._housekeeping()
                    self.dispatch()
                except Exception as e:  # never a silent stop: every rank waiting hears of it
                    log.exception("stoker node pool: group %s failed", self.key[:8])
                    self._fail(e)
            self.pool.wake()

    def _housekeeping(self) -> None:
        for pw in self._slots:  # workers that finished starting since
            t = pw.task
            if t is not None and not t.began:
                self._tell_began(t)
                self._stuck_starting(t)
        now = time.monotonic()
        if now - self._checked_at > RECHECK_S:
            self._checked_at = now
            self.ledger.recheck(self.streams.owed_now)

    # -- outcomes --------------------------------------------------------------------------------
    def _event(self, ev) -> None:
        if isinstance(ev, events.EpochBegun):
            return  # the seed set before a task (dispatch)
        pw = self._slots[ev.worker]
        task = pw.task
        if task is None or task.number != ev.task:
            if isinstance(ev, events.BatchReady):
                ev.batch.discard()
            return
        if events.is_outcome(ev):
            pw.loaded()
            self.budget.give()
            self._tasks.pop(task.ident, None)
            self._progress_at = time.monotonic()
            self.board.add("batches_yielded")
        if isinstance(ev, events.BatchReady):
            self._deliver(task, ev.batch, pw.pid)
            return
        for a in task.askers:
            out = copy.copy(ev)
            out.worker, out.task = a.w, a.task
            self.pool.send(a.cid, wire.Event(a.w, a.gen, out))
            if events.is_outcome(ev) and a.cid in self._clients:
                self.pool.tally[self._clients[a.cid].rank] += 1

    def _deliver(self, task: Task, pending, pid) -> None:
        if not task.askers:
            pending.discard()
            return
        takers = {self._clients[a.cid].rank for a in task.askers if a.cid in self._clients}
        held = self.ledger.add(task.ident, pending, self.streams.owed(task.ident, takers),
                               pid or 0)
        for a in task.askers:
            self._send_batch(held, a)
        self.ledger.settle(held)  # (when every send found its rank gone)

    def _send_batch(self, held, a: Asker) -> None:
        ok = self.pool.send(a.cid, wire.Batch(a.w, a.gen, a.task, held.bid,
                                              held.pending.offset, held.nbytes, held.pid),
                            [held.pending.fd])
        c = self._clients.get(a.cid)
        if ok and c is not None:
            self.ledger.gave(held, a.cid, c.rank)
            self.pool.tally[c.rank] += 1

    def release(self, cid: int, bid: int) -> None:
        with self.lock:
            self.ledger.release(bid, cid)

    # -- deaths ----------------------------------------------------------------------------------
    def _died(self, ev: events.WorkerExited) -> None:
        pw = self._slots[ev.worker]
        task = pw.ended(ev.started, bool(ev.signum))
        self._tell_pids()
        if task is not None:
            self.budget.give()
        failing = breaks_group(self._slots, self._progress_at)
        if failing:  # the ranks must not start it again: the pool did, and it kept failing
            ev = deaths.cannot_restart(ev)
        if task is not None and not ev.started and task.askers and not failing:
            # It died starting (the OOM killer choosing the newest process, say), before it
            # loaded anything of the task: the task waits for another worker; the ranks hear
            # only of a start-up that keeps failing (the group breaks, below).
            task.worker, task.began, task.killed = None, False, False
            self._requeue(task)
            task = None
        if task is not None:
            self._tasks.pop(task.ident, None)
            for a in list(task.askers):
                self._tell_death(a, ev)
        if failing and self.broken is None:
            log.warning("stoker node pool: group %s is broken: %s", self.key[:8], ev.cause)
            self.broken = ev
            self._answer_all(ev)

    def _fail(self, error: BaseException) -> None:
        """The group cannot go on (its workers could not be started again, a slot was found
        overwritten): it is broken, and every rank waiting on it is told, with the error."""
        self.broken = self.broken or deaths.group_lost(error)
        self._answer_all(self.broken)

    def _answer_all(self, ev: events.WorkerExited) -> None:
        for t in list(self._tasks.values()):
            for a in list(t.askers):
                self._tell_death(a, ev)

    def _tell_death(self, a: Asker, ev: events.WorkerExited) -> None:
        """The rank's virtual worker `a.w` is told that it died with a pool worker (or could not
        be served); the pool forgets every other task of that incarnation (the rank re-issues
        them)."""
        c = self._clients.get(a.cid)
        if c is None or c.forgot(a.w, a.gen):
            return
        self.pool.send(a.cid, wire.Died(a.w, a.gen, deaths.for_rank(ev, a.w, a.task)))
        self.forget(a.cid, a.w, a.gen)

    def forget(self, cid: int, w: int, gen: int) -> None:
        """Drops every task of the rank's virtual worker `w` up to incarnation `gen`."""
        with self.lock:
            c = self._clients.get(cid)
            if c is None:
                return
            c.forgotten[w] = max(gen, c.forgotten.get(w, -1))
            self._drop_askers(lambda a: a.of(cid, w, gen))

    def _drop_askers(self, which) -> None:
        """(Under the lock.) Drops the askers `which` names, and tasks left unasked and idle."""
        for t in list(self._tasks.values()):
            t.askers = [a for a in t.askers if not which(a)]
            if not t.askers and t.worker is None:
                del self._tasks[t.ident]

    def tell_failed(self, cid: int, message, error: BaseException) -> None:
        """A message of `cid` about a virtual worker could not be handled: that worker dies."""
        with self.lock:
            w, gen = getattr(message, "w", None), getattr(message, "gen", None)
            if w is not None and gen is not None:
                self._tell_death(Asker(cid, w, gen, getattr(message, "task", -1)),
                                 deaths.message_failed(w, message, error))

    # -- clients ---------------------------------------------------------------------------------
    def attach(self, cid: int, rank: int) -> None:
        """Connection `cid` of the rank whose process is `rank` joins the group."""
        with self.lock:
            self._clients[cid] = Client(cid, rank)
            self.streams.attach(rank)

    def expect(self, more: int) -> None:
        """How many ranks of the job on this machine have not attached to the pool yet."""
        with self.lock:
            self.streams.expect(more)

    def rank_gone(self, rank: int) -> None:
        """The process of `rank` ended: nothing is kept for it any more."""
        with self.lock:
            self.streams.gone(rank)
            self.ledger.not_owed(rank)

    def detach(self, cid: int) -> None:
        """The client's connection ended: its tasks are dropped, its batches let go."""
        with self.lock:
            c = self._clients.pop(cid, None)
            if c is None:
                return
            self._drop_askers(lambda a: a.cid == cid)
            for t in c.queue:
                if t.askers:  # another rank joined it: it waits in that rank's queue now
                    self._requeue(t, front=False)
            self.ledger.drop(cid)  # (its rank may come back on its next iterator's connection)
            if not self._clients:
                self.idle_since = time.monotonic()
                self.budget.leave(self)

    def add_task(self, cid: int, m: wire.Task) -> None:
        with self.lock:
            c = self._clients.get(cid)
            if c is None or c.forgot(m.w, m.gen):
                return  # sent before the rank heard of its worker's death: it re-issues it
            a = Asker(cid, m.w, m.gen, m.task)
            if self.broken is not None:
                self._tell_death(a, self.broken)
                return
            one_at_a_time = m.serial  # (not in its identity: the same batch however it loads)
            ident = (m.base_seed, m.epoch, m.fmt, m.payload)
            if self.streams.saw(c.rank, ident):  # its first task of the epoch: whose peer
                self.ledger.recheck(self.streams.owed_now)
            held = self.ledger.find(ident)
            if held is not None:  # another rank of the group has it: the same slot
                self._send_batch(held, a)
                self.ledger.settle(held)  # (when that send found the rank gone)
                return
            same = self._tasks.get(ident)
            if same is not None:
                same.askers.append(a)
                same.one_at_a_time = same.one_at_a_time or one_at_a_time
                return
            t = Task(ident, m.fmt, m.payload, [a], one_at_a_time=one_at_a_time)
            self._tasks[ident] = t
            c.queue.append(t)
            self.dispatch()

    def _requeue(self, task: Task, front: bool = True) -> None:
        c = self._clients.get(task.askers[0].cid) if task.askers else None
        if c is not None:
            (c.queue.appendleft if front else c.queue.append)(task)
        elif self._tasks.get(task.ident) is task:  # nobody wants it any more
            del self._tasks[task.ident]

    # -- hangs -----------------------------------------------------------------------------------
    def kill_targets(self, cid: int, w: int, gen: int, hung: Hung) -> list:
        """The rank's hang watch gave up on its virtual worker `w`: the pool workers loading
        its tasks, to be killed by ``kill`` (without the lock). When none is (its task ended
        meanwhile, or no worker ever took it), the rank is told of the death at once."""
        with self.lock:
            out = []
            for pw in self._slots:
                t = pw.task
                if t is not None and any(a.cid == cid and a.w == w and a.gen == gen
                                         for a in t.askers):
                    v = self.workers.view(pw.slot)
                    st = (v.status if v is not None else None) or {}
                    named = hung
                    if named.index is None and st.get("index") is not None:
                        named = dataclasses.replace(named, index=st["index"])
                    out.append((pw.slot, named))
            if not out:
                self._tell_death(Asker(cid, w, gen, -1), deaths.hung_without_worker(w, hung))
            return out

    def kill(self, targets: list) -> None:
        for slot, named in targets:
            if not named.stack:
                named = dataclasses.replace(named, stack=self.workers.capture_stack(slot))
            self.workers.kill(slot, named)

    def _stuck_starting(self, task: Task) -> None:
        """A worker that has not finished starting (a deadlocked worker_init_fn, an import
        that never returns) long after it was given a task is killed as a local iterator's
        hang watch would: its death, named so, reaches the ranks that wait."""
        waited = task.waited()
        if task.began or task.killed or waited <= STARTUP_GRACE_S or task.worker is None:
            return
        task.killed = True
        stuck = (f"pool worker {task.worker.slot} has not finished starting {waited:.0f} s "
                 "after it was given a task (a slow or deadlocked import or worker_init_fn)")
        self.workers.kill(task.worker.slot, Hung(
            None, waited, self.workers.capture_stack(task.worker.slot), stuck=stuck))

    # -- scheduling ------------------------------------------------------------------------------
    def dispatch(self) -> None:
        """Free workers (started as needed, up to ``size``) take the next tasks of the rank
        furthest behind, each with a token of the node's budget."""
        with self.lock:
            if self._closed:
                return
            now = time.monotonic()
            while True:
                tally = self.pool.tally  # (a rank's batches over every epoch and group)
                c = min((c for c in self._clients.values() if c.head() is not None),
                        key=lambda c: tally[c.rank], default=None)
                if c is None:
                    self.budget.leave(self)
                    return
                pw = next((p for p in self._slots if p.idle()), None) or \
                    next((p for p in self._slots if p.startable(now)), None)
                if pw is None or not self.budget.take(self, tally[c.rank]):
                    return
                task = c.queue.popleft()
                try:
                    if not pw.alive:
                        self._start(pw)
                    self._send(pw, task)
                except Exception as e:  # this task's askers hear of it; the others go on
                    log.exception("stoker node pool: a task could not be given to a worker")
                    if pw.task is task:
                        pw.task = None
                    task.worker = None
                    self.budget.give()
                    self._tasks.pop(task.ident, None)
                    for a in list(task.askers):
                        self._tell_death(a, deaths.message_failed(a.w, task, e))

    def _start(self, pw: PoolWorker) -> None:
        self.workers.start(pw.slot, self.config)
        v = self.workers.view(pw.slot)
        pw.started(v.pid if v is not None else None,
                   (self.config.seeder.base_seed, self.config.seeder.epoch))
        self._tell_pids()

    def _tell_pids(self) -> None:
        """Every rank of the group hears which pool workers it has now (its stats name them)."""
        message = wire.Pids(tuple(pw.pid for pw in self._slots if pw.alive))
        for cid in self._clients:
            self.pool.send(cid, message)

    def _send(self, pw: PoolWorker, task: Task) -> None:
        base_seed, epoch = task.ident[0], task.ident[1]
        if pw.seed != (base_seed, epoch):
            self.workers.begin_epoch(pw.slot, epoch, protocol.encode_resume(base_seed, None))
            pw.seed = (base_seed, epoch)
        task.worker, task.sent_at, pw.task = pw, time.monotonic(), task
        self._tell_began(task)
        if not self.workers.send_encoded_task(pw.slot, task.number, task.fmt, task.payload,
                                              task.one_at_a_time):
            pw.task, task.worker, pw.lost = None, None, True  # its death is on its way
            self.budget.give()
            self._requeue(task)

    def _tell_began(self, task: Task) -> None:
        """The ranks that asked for `task` hear when a worker past its start-up takes it: their
        hang watch times a sample from then (a worker still importing is not hung)."""
        pw = task.worker
        v = self.workers.view(pw.slot) if pw is not None else None
        st = v.status if v is not None else None
        if task.began or st is None or st.get("state") == "starting":
            return
        task.began = True
        pid = pw.pid if pw is not None else None
        for a in task.askers:
            self.pool.send(a.cid, wire.Began(a.w, a.gen, a.task, pid or 0))

    # -- ending ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Marks the group ended: its thread sees it and returns."""
        with self.lock:
            self._closed = True
            for pw in self._slots:
                if pw.task is not None:
                    pw.task = None
                    self.budget.give()
            self.budget.leave(self)
            self.ledger.clear()

    def end(self) -> None:
        """Ends the workers and waits for the thread, after ``close`` (without any lock: a
        worker may take a moment to be reaped)."""
        self.workers.shutdown()
        if self._thread.ident is not None:
            self._thread.join()
        self._sealed.close()
        wire.close_all(self._stdio)
        self.board.close()
