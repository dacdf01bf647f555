"""stoker.placements.node.group: one dataset's workers in the node pool, driven by hand. The
group is given fake workers (the methods ``LocalProcesses`` offers it) and a fake pool (what it
sends to ranks is recorded); its thread's loop (``run``) is run in the test's own thread over a
script of events, and ends when the script does. No process is started."""

from __future__ import annotations

import collections
import gc
import os
import threading
import types
import weakref

import pytest

from stoker.placements.base import Hung
from stoker.placements.node import group as group_module
from stoker.placements.node import records, wire
from stoker.placements.node.budget import Budget
from stoker.placements.node.group import Group
from stoker.wire import events, fdpass, protocol

pytestmark = pytest.mark.unit

RANK_A, RANK_B = 1001, 1002  # rank processes' pids (their identity in the pool)


class ScriptDone(BaseException):
    """The script ran out (``_drive``): not an error of the workers', which the loop would
    catch."""


class FakeWorkers:
    """What ``Group`` asks of ``LocalProcesses``: processes are slots with a made-up pid; the
    events ``wait`` returns come from ``script`` (a callable in it is called, as the test's
    action between two events, and what it returns, when not None, is the next event; an
    exception in it is raised by ``wait``); when it runs out the group is closed, and its loop
    ends."""

    def __init__(self, n: int):
        self.num_workers = n
        self.group: Group | None = None
        self.script: collections.deque = collections.deque()
        self.calls: list = []
        self.views: dict = {}
        self.accept = True  # what send_encoded_task answers
        self.serial: dict = {}  # task number -> whether it was sent to load one at a time
        self._pids = iter(range(5000, 6000))
        self.timeouts: list = []  # each wait's
        self.configs: dict = {}  # slot -> the config it was started with
        self.epochs: list = []  # (slot, epoch, payload) of each begin_epoch
        self.fmts: dict = {}  # task number -> its index format
        self.killed: list = []  # (slot, Hung)
        self.start_states: collections.deque = collections.deque()  # then "running"
        self.with_view = True  # whether a started worker has a view (and a report) at once
        self.fail_start: collections.deque = collections.deque()  # raised by the next starts
        self.fail_send: collections.deque = collections.deque()  # raised by the next sends
        self.close_at_end = True  # False: the end of the script ends the loop (``_drive``)

    def wait(self, timeout):
        self.timeouts.append(timeout)
        while self.script:
            step = self.script.popleft()
            if isinstance(step, BaseException):
                raise step
            if callable(step):
                step = step()
                if step is None:
                    continue
            return step
        if not self.close_at_end:
            raise ScriptDone
        self.group.close()
        return None

    def view(self, slot):
        return self.views.get(slot)

    def start(self, slot, config):
        if self.fail_start:
            raise self.fail_start.popleft()
        self.calls.append(("start", slot))
        self.configs[slot] = config
        state = self.start_states.popleft() if self.start_states else "running"
        if self.with_view:
            self.views[slot] = types.SimpleNamespace(pid=next(self._pids),
                                                     status={"state": state, "index": 7})
        else:
            self.views.pop(slot, None)

    def begin_epoch(self, slot, epoch, payload):
        self.calls.append(("begin_epoch", slot, epoch))
        self.epochs.append((slot, epoch, payload))

    def send_encoded_task(self, slot, number, fmt, payload, serial=False):
        if self.fail_send:
            raise self.fail_send.popleft()
        self.calls.append(("task", slot, number, payload))
        self.serial[number] = serial
        self.fmts[number] = fmt
        return self.accept

    def kill(self, slot, hung):
        self.calls.append(("kill", slot, hung.stuck or hung.index))
        self.killed.append((slot, hung))

    def capture_stack(self, slot):
        self.calls.append(("capture_stack", slot))
        return f"stack of slot {slot}"

    def shutdown(self):
        self.calls.append(("shutdown",))

    def sent(self) -> list:
        """(slot, task number, payload) of each task sent, in order."""
        return [c[1:] for c in self.calls if c[0] == "task"]

    def loads(self) -> list:
        """The payload of each task sent, in order."""
        return [p for _, _, p in self.sent()]

    def last(self) -> int:
        """The number of the last task sent."""
        return self.sent()[-1][1]


class FakePool:
    job = "test"

    def __init__(self):
        self.tally: collections.Counter = collections.Counter()
        self.out: list = []  # (cid, message)
        self.fds: list = []  # (message, fds) of each message sent with descriptors
        self.refuse: set = set()  # connections gone: a send to them fails

    def send(self, cid, message, fds=()):
        self.out.append((cid, message))
        if fds:
            self.fds.append((message, list(fds)))
        return cid not in self.refuse

    def wake(self):
        pass

    def to(self, cid, kind) -> list:
        return [m for c, m in self.out if c == cid and isinstance(m, kind)]


class FakeLease:
    """What ``PendingBatch.lend`` returns: the slot stays lent while it lives."""


class FakePending:
    """A slot's batch as the supervisor hands it (``PendingBatch``)."""

    def __init__(self, offset=0, nbytes=64, fd=-1):
        self.offset, self.nbytes, self.fd = offset, nbytes, fd
        self.discarded = self.lent = False
        self._lease = lambda: None

    def lend(self):
        self.lent = True
        lease = FakeLease()
        self._lease = weakref.ref(lease)
        return lease

    def kept(self) -> bool:
        """Whether the slot is still lent (the pool holds the batch for a rank)."""
        gc.collect()
        return self._lease() is not None

    def discard(self):
        self.discarded = True


class FakeBoard:
    def __init__(self):
        self.counts: collections.Counter = collections.Counter()
        self.closed = False

    def add(self, name, value=1):
        self.counts[name] += value

    def close(self):
        self.closed = True


def _group(n=2, limit=None, budget=None, stdio=()):
    pool, workers = FakePool(), FakeWorkers(n)
    config = types.SimpleNamespace(seeder=types.SimpleNamespace(base_seed=0, epoch=0))
    sealed = types.SimpleNamespace(close=lambda: None)
    g = Group(pool, "k" * 64, config, sealed, budget or Budget(limit or n), workers, FakeBoard(),
              stdio)
    workers.group = g
    return g, pool, workers


def _task(w, gen, task, index=b"\x01", seed=5, epoch=0, fmt=0, serial=False):
    return wire.Task(w, gen, task, fmt, index, seed, epoch, serial)


def _exited(slot, started=True, signum=9, code=None, task=None):
    return events.WorkerExited(
        worker=slot, pid=1, signum=signum, exit_code=code, cause="was killed",
        explanation="it was killed", index=None, busy=started, hung=False, started=started,
        outside=False, task=task)


def test_nothing_runs_until_start():
    g, _, workers = _group()
    before = threading.active_count()
    assert g._thread.ident is None and threading.active_count() == before
    assert workers.calls == []
    workers.script.append(g.close)  # (the thread's loop ends at once)
    g.start()
    g._thread.join(5)
    assert not g._thread.is_alive()
    g.end()
    assert workers.calls == [("shutdown",)] and g.board.closed


def test_a_task_starts_a_worker_which_takes_it_and_its_batch_goes_to_the_rank():
    g, pool, workers = _group()
    g.attach(1, RANK_A)
    g.add_task(1, _task(0, 1, 10, seed=5, epoch=2))
    # started, set to the task's seed and epoch, given the task
    assert workers.calls[:2] == [("start", 0), ("begin_epoch", 0, 2)]
    (slot, number, payload), = workers.sent()
    assert (slot, payload) == (0, b"\x01")
    assert pool.to(1, wire.Pids) == [wire.Pids((5000,))]
    assert pool.to(1, wire.Began) == [wire.Began(0, 1, 10, 5000)]
    assert g.budget._busy == 1
    pending = FakePending()
    workers.script.append(events.BatchReady(0, number, pending))
    g.run()
    (batch,) = pool.to(1, wire.Batch)
    assert (batch.w, batch.gen, batch.task, batch.pid) == (0, 1, 10, 5000)
    assert pending.lent and not pending.discarded
    assert g.budget._busy == 0 and pool.tally[RANK_A] == 1
    assert g.board.counts["batches_yielded"] == 1


def test_a_task_to_load_one_at_a_time_reaches_the_worker_so():
    g, _, workers = _group()
    g.attach(1, RANK_A)
    g.add_task(1, _task(0, 1, 10))
    g.add_task(1, _task(1, 1, 11, index=b"\x02", serial=True))
    (_, plain, _), (_, serial, _) = workers.sent()
    assert workers.serial == {plain: False, serial: True}


def test_two_ranks_asking_for_the_same_task_get_one_load_and_the_same_batch():
    g, pool, workers = _group()
    g.attach(1, RANK_A)
    g.attach(2, RANK_B)
    g.add_task(1, _task(0, 1, 10))
    g.add_task(2, _task(3, 1, 44))  # (the same seed, epoch and indices: the same batch)
    ((_, number, _),) = workers.sent()
    workers.script.append(events.BatchReady(0, number, FakePending()))
    g.run()
    (a,), (b,) = pool.to(1, wire.Batch), pool.to(2, wire.Batch)
    assert a.bid == b.bid and (a.w, a.task) == (0, 10) and (b.w, b.task) == (3, 44)
    assert pool.tally == {RANK_A: 1, RANK_B: 1}


def test_an_event_of_a_task_the_worker_no_longer_loads_is_dropped():
    g, pool, workers = _group()
    g.attach(1, RANK_A)
    g.add_task(1, _task(0, 1, 10))
    ((_, number, _),) = workers.sent()
    stale = FakePending()
    workers.script.append(events.BatchReady(0, number + 1000, stale))
    g.run()
    assert stale.discarded and pool.to(1, wire.Batch) == []


def test_the_rank_furthest_behind_goes_first():
    g, pool, workers = _group(n=1)
    g.attach(1, RANK_A)
    g.attach(2, RANK_B)
    pool.tally[RANK_A] = 5  # A has received more batches than B
    g.add_task(1, _task(0, 1, 10, index=b"\x01"))  # (taken at once: the only one waiting)
    g.add_task(1, _task(0, 1, 11, index=b"\x02"))
    g.add_task(2, _task(0, 1, 20, index=b"\x03"))
    first = workers.sent()[0][1]
    workers.script.append(events.BatchReady(0, first, FakePending()))
    g.run()
    assert [p for _, _, p in workers.sent()] == [b"\x01", b"\x03"]  # B's before A's second


def test_a_worker_that_dies_on_a_task_is_told_to_its_askers_who_re_issue_the_rest():
    g, pool, workers = _group(n=1)
    g.attach(1, RANK_A)
    g.add_task(1, _task(0, 1, 10, index=b"\x01"))
    g.add_task(1, _task(0, 1, 11, index=b"\x02"))  # (queued: one worker)
    workers.script.extend([
        _exited(0, started=True, task=workers.sent()[0][1]),
        lambda: g.add_task(1, _task(0, 1, 12, index=b"\x03")),  # (sent before the rank heard)
        lambda: g.add_task(1, _task(0, 2, 13, index=b"\x04")),  # (its next incarnation)
    ])
    g.run()
    (died,) = pool.to(1, wire.Died)
    assert (died.w, died.gen, died.exited.worker, died.exited.task) == (0, 1, 0, 10)
    assert died.exited.restartable
    # the rest of that incarnation was forgotten (task 11, and 12 sent before the rank knew):
    # only the next incarnation's task is loaded, by a worker started again
    assert [p for _, _, p in workers.sent()] == [b"\x01", b"\x04"]
    assert [c[0] for c in workers.calls].count("start") == 2


def test_a_worker_that_dies_starting_hands_its_task_to_the_next_one():
    g, pool, workers = _group(n=1)
    g.attach(1, RANK_A)
    g.add_task(1, _task(0, 1, 10))
    workers.script.append(_exited(0, started=False, signum=9))  # (the OOM killer, say)
    g.run()
    assert pool.to(1, wire.Died) == []
    assert [c[0] for c in workers.calls].count("start") == 2  # started again
    assert [p for _, _, p in workers.sent()] == [b"\x01", b"\x01"]


def test_workers_that_keep_failing_to_start_break_the_group():
    g, pool, workers = _group(n=1)
    g.attach(1, RANK_A)
    g.add_task(1, _task(0, 1, 10))
    for _ in range(3):  # (an exception at start-up: the same each time)
        workers.script.append(_exited(0, started=False, signum=0, code=1))
    g.run()
    assert g.broken is not None and not g.broken.restartable
    (died,) = pool.to(1, wire.Died)
    assert not died.exited.restartable
    g.add_task(1, _task(1, 1, 11, index=b"\x09"))  # answered at once with the verdict
    assert [d.w for d in pool.to(1, wire.Died)] == [0, 1]
    assert len(workers.sent()) == 3


def test_a_task_the_worker_could_not_take_waits_for_another():
    g, pool, workers = _group(n=1)
    g.attach(1, RANK_A)
    workers.accept = False  # (its channel is gone: its death is on its way)
    g.add_task(1, _task(0, 1, 10))
    assert g.budget._busy == 0 and pool.to(1, wire.Died) == []
    workers.accept = True
    workers.script.append(_exited(0, started=True))
    g.run()
    assert pool.to(1, wire.Died) == []  # (the death concerned no task of the rank's)
    assert len(workers.sent()) == 2


def test_a_rank_that_leaves_drops_its_tasks_and_a_joined_one_goes_on_for_the_other():
    g, pool, workers = _group(n=1)
    g.attach(1, RANK_A)
    g.attach(2, RANK_B)
    g.add_task(1, _task(0, 1, 10, index=b"\x01"))  # running
    g.add_task(1, _task(0, 1, 11, index=b"\x02"))  # queued for A only
    g.add_task(1, _task(0, 1, 12, index=b"\x03"))  # queued for A and B
    g.add_task(2, _task(0, 1, 22, index=b"\x03"))
    g.detach(1)
    assert g.clients == 1
    workers.script.append(events.BatchReady(0, workers.sent()[0][1], FakePending()))
    g.run()
    assert [p for _, _, p in workers.sent()] == [b"\x01", b"\x03"]
    assert pool.to(1, wire.Batch) == []


def test_a_hang_the_rank_saw_kills_the_worker_loading_its_task():
    g, pool, workers = _group()
    g.attach(1, RANK_A)
    g.add_task(1, _task(0, 1, 10))
    targets = g.kill_targets(1, 0, 1, Hung(None, 30.0, None))
    assert [(slot, h.index) for slot, h in targets] == [(0, 7)]  # (the index it loads now)
    g.kill(targets)
    assert workers.calls[-1] == ("kill", 0, 7)
    assert g.kill_targets(1, 3, 1, Hung(None, 30.0, None)) == []  # nobody loads w 3's task:
    (died,) = pool.to(1, wire.Died)  # it is told of the death at once
    assert died.w == 3


def test_close_gives_back_the_tokens_of_running_tasks():
    g, _, workers = _group()
    g.attach(1, RANK_A)
    g.add_task(1, _task(0, 1, 10, index=b"\x01"))
    g.add_task(1, _task(0, 1, 11, index=b"\x02"))
    assert g.budget._busy == 2
    g.close()
    assert g.budget._busy == 0
    g.add_task(1, _task(0, 1, 12, index=b"\x03"))  # a closed group dispatches nothing
    assert len(workers.sent()) == 2


# -- the group's loop and life ---------------------------------------------------------------------
@pytest.fixture
def clock(monkeypatch):
    """The group's and its records' clock, moved by hand (``clock[0]``: seconds); a sleep
    returns at once (given seconds, as ``time.sleep`` must be)."""
    now = [1000.0]
    fake = types.SimpleNamespace(monotonic=lambda: now[0], sleep=lambda s: float(s) and None)
    monkeypatch.setattr(group_module, "time", fake)
    monkeypatch.setattr(records, "time", fake)
    return now


def _drive(g):
    """Runs the group's loop over its workers' script and leaves the group open (what it keeps
    is still kept)."""
    g.workers.close_at_end = False
    try:
        g.run()
    except ScriptDone:
        pass
    finally:
        g.workers.close_at_end = True


def _tick():
    """An event the group ignores (a worker took an epoch): its loop looks at its workers."""
    return events.EpochBegun(0, 0)


def test_start_runs_the_loop_in_a_daemon_thread_that_sees_close_within_a_poll():
    g, _, workers = _group()
    seen = {}

    def look():
        t = threading.current_thread()
        seen.update(mine=t is g._thread, daemon=t.daemon,
                    named=t.name.startswith("stoker-node-group-"))

    workers.script.append(look)
    g.start()
    g._thread.join(5)
    assert seen == {"mine": True, "daemon": True, "named": True}
    assert workers.timeouts and all(0 < t <= 0.5 for t in workers.timeouts)


def test_a_group_never_started_ends_all_the_same():
    g, _, workers = _group()
    g.close()
    g.end()  # (no thread to wait for)
    assert workers.calls == [("shutdown",)] and g.board.closed


def test_the_first_ranks_stdio_goes_to_the_workers_and_is_closed_at_the_end():
    r, w = os.pipe()
    g, _, workers = _group(stdio=(r, w))
    assert all(isinstance(c, fdpass.ChannelFd) for c in g.config.stdio)
    assert [c.fd for c in g.config.stdio] == [r, w]
    g.attach(1, RANK_A)
    g.add_task(1, _task(0, 1, 10))
    assert workers.configs[0] is g.config
    g.close()
    g.end()
    for fd in (r, w):
        with pytest.raises(OSError):
            os.fstat(fd)
    g, _, _ = _group()  # without the rank's two descriptors, its workers print where they do
    assert not hasattr(g.config, "stdio")


def test_idle_since_is_when_the_group_was_made_then_when_its_last_rank_left(clock):
    g, _, _ = _group()
    assert g.idle_since == 1000.0
    g.attach(1, RANK_A)
    g.attach(2, RANK_B)
    clock[0] = 1010.0
    g.detach(1)
    assert g.idle_since == 1000.0 and g.clients == 1
    clock[0] = 1020.0
    g.detach(2)
    g.detach(2)  # (twice: nothing more)
    assert g.idle_since == 1020.0 and g.clients == 0


# -- what reaches the ranks ------------------------------------------------------------------------
def test_other_events_reach_every_asker_addressed_as_its_own_and_outcomes_count():
    g, pool, workers = _group(n=1)
    g.attach(1, RANK_A)
    g.attach(2, RANK_B)
    pool.tally[RANK_A] = 5
    g.add_task(1, _task(0, 1, 10))
    g.add_task(2, _task(3, 2, 44))  # (the same batch)
    number = workers.last()
    workers.script.extend([
        events.SamplesSkipped(0, number, [(1, "bad")], False),  # (not an outcome)
        lambda: g.add_task(1, _task(0, 1, 11, index=b"\x02")),
        events.TaskFailed(0, number, {"message": "boom"}),
    ])
    _drive(g)
    for cid, w, gen, task in ((1, 0, 1, 10), (2, 3, 2, 44)):
        skipped, failed = pool.to(cid, wire.Event)
        assert (skipped.w, skipped.gen, failed.w, failed.gen) == (w, gen, w, gen)
        assert isinstance(skipped.event, events.SamplesSkipped)
        assert (skipped.event.worker, skipped.event.task, skipped.event.records) == \
            (w, task, [(1, "bad")])
        assert isinstance(failed.event, events.TaskFailed)
        assert (failed.event.worker, failed.event.task, failed.event.report) == \
            (w, task, {"message": "boom"})
    assert pool.tally == {RANK_A: 6, RANK_B: 1}  # (one outcome each)
    assert workers.loads() == [b"\x01", b"\x02"]  # (the worker was free after the failure only)
    assert g.budget._busy == 1


def test_a_batch_message_names_its_slot_and_the_rank_lets_go_of_it_with_release():
    g, pool, workers = _group()
    g.attach(1, RANK_A)
    pool.tally[RANK_A] = 5
    g.add_task(1, _task(0, 1, 10))
    pending = FakePending(offset=128, nbytes=4096, fd=77)
    workers.script.append(events.BatchReady(0, workers.last(), pending))
    _drive(g)
    (batch,) = pool.to(1, wire.Batch)
    assert (batch.offset, batch.nbytes) == (128, 4096) and isinstance(batch.bid, int)
    assert pool.fds == [(batch, [77])]  # (the slot's memfd goes beside the message)
    assert pool.tally[RANK_A] == 6
    assert pending.kept()
    g.release(2, batch.bid)  # (another connection's release: not its view)
    g.release(1, batch.bid + 1000)
    assert pending.kept()
    g.release(1, batch.bid)
    assert not pending.kept()  # its slot is its worker's again


def test_a_rank_the_batch_did_not_reach_is_neither_credited_nor_taken_for_a_holder():
    g, pool, workers = _group()
    g.attach(1, RANK_A)
    g.attach(2, RANK_B)
    pool.refuse.add(2)  # (its connection is going)
    g.add_task(1, _task(0, 1, 10))
    g.add_task(2, _task(0, 1, 20))
    pending = FakePending()
    workers.script.append(events.BatchReady(0, workers.last(), pending))
    _drive(g)
    (batch,) = pool.to(1, wire.Batch)
    assert pool.tally == {RANK_A: 1}
    g.release(1, batch.bid)
    assert not pending.kept()


def test_a_connection_that_ends_lets_go_of_what_it_held():
    g, pool, workers = _group()
    g.attach(1, RANK_A)
    g.add_task(1, _task(0, 1, 10))
    pending = FakePending()
    workers.script.append(events.BatchReady(0, workers.last(), pending))
    _drive(g)
    assert pending.kept()
    g.detach(1)
    assert not pending.kept()


def _two_peers_share_a_first_batch(g, pool, workers):
    """Ranks A and B attach and both ask for the epoch's first batch (peers), which is loaded
    once, sent to both and let go."""
    g.attach(1, RANK_A)
    g.attach(2, RANK_B)
    g.add_task(1, _task(0, 1, 10, index=b"\x01"))
    g.add_task(2, _task(0, 1, 20, index=b"\x01"))
    first = FakePending()
    workers.script.append(events.BatchReady(0, workers.last(), first))
    _drive(g)
    for cid in (1, 2):
        (batch,) = pool.to(cid, wire.Batch)
        g.release(cid, batch.bid)
    assert not first.kept()


def test_a_batch_is_kept_for_a_peer_that_has_not_asked_yet_and_served_to_it_unloaded(clock):
    g, pool, workers = _group()
    _two_peers_share_a_first_batch(g, pool, workers)
    g.add_task(1, _task(0, 1, 11, index=b"\x02"))
    pending = FakePending()
    workers.script.append(events.BatchReady(0, workers.last(), pending))
    _drive(g)
    (_, mine) = pool.to(1, wire.Batch)
    g.release(1, mine.bid)
    assert pending.kept()  # for B, its peer, which will ask for it
    clock[0] += 10  # (the kept batches are looked at again: B is still owed it)
    workers.script.append(_tick())
    _drive(g)
    assert pending.kept()
    g.add_task(2, _task(0, 1, 21, index=b"\x02"))
    (_, theirs) = pool.to(2, wire.Batch)
    assert theirs.bid == mine.bid and theirs.task == 21
    assert workers.loads() == [b"\x01", b"\x02"]  # (not loaded again)
    assert pool.tally == {RANK_A: 2, RANK_B: 2}
    g.release(2, theirs.bid)
    assert not pending.kept()


def test_a_rank_whose_first_task_differs_is_no_peer_and_nothing_is_kept_for_it():
    g, pool, workers = _group()
    g.attach(1, RANK_A)
    g.attach(2, RANK_B)  # (no task yet: taken for a peer)
    g.add_task(1, _task(0, 1, 10, index=b"\x01"))
    pending = FakePending()
    workers.script.append(events.BatchReady(0, workers.last(), pending))
    _drive(g)
    (batch,) = pool.to(1, wire.Batch)
    g.release(1, batch.bid)
    assert pending.kept()
    g.add_task(2, _task(0, 1, 20, index=b"\x07"))  # B's first task: another stream
    assert not pending.kept()


def test_a_rank_that_asked_for_nothing_yet_is_owed_until_it_took_the_batch():
    g, pool, workers = _group()
    g.attach(1, RANK_A)
    g.attach(2, RANK_B)
    g.add_task(1, _task(0, 1, 10, index=b"\x01"))
    pending = FakePending()
    workers.script.append(events.BatchReady(0, workers.last(), pending))
    _drive(g)
    g.release(1, pool.to(1, wire.Batch)[0].bid)
    assert pending.kept()
    g.add_task(2, _task(0, 1, 20, index=b"\x01"))  # (the same first task: a peer)
    (batch,) = pool.to(2, wire.Batch)
    g.release(2, batch.bid)
    assert not pending.kept()  # nobody else is owed it


def test_a_batch_is_kept_for_ranks_not_attached_yet_only_while_some_are_expected():
    for more, kept in ((1, True), (0, False)):
        g, pool, workers = _group()
        g.expect(more)
        g.attach(1, RANK_A)
        g.add_task(1, _task(0, 1, 10))
        pending = FakePending()
        workers.script.append(events.BatchReady(0, workers.last(), pending))
        _drive(g)
        g.release(1, pool.to(1, wire.Batch)[0].bid)
        assert pending.kept() is kept


def test_nothing_is_kept_for_a_rank_whose_process_ended():
    g, pool, workers = _group()
    g.attach(1, RANK_A)
    g.attach(2, RANK_B)
    g.add_task(1, _task(0, 1, 10, index=b"\x01"))
    pending = FakePending()
    workers.script.append(events.BatchReady(0, workers.last(), pending))
    _drive(g)
    g.release(1, pool.to(1, wire.Batch)[0].bid)
    assert pending.kept()  # (for B)
    g.rank_gone(RANK_B)
    assert not pending.kept()
    g.add_task(1, _task(0, 1, 11, index=b"\x02"))
    later = FakePending()
    workers.script.append(events.BatchReady(0, workers.last(), later))
    _drive(g)
    g.release(1, pool.to(1, wire.Batch)[1].bid)
    assert not later.kept()


def test_a_task_asked_again_once_its_batch_went_back_is_loaded_again():
    g, pool, workers = _group()
    g.attach(1, RANK_A)
    g.add_task(1, _task(0, 1, 10))
    workers.script.append(events.BatchReady(0, workers.last(), FakePending()))
    _drive(g)
    g.release(1, pool.to(1, wire.Batch)[0].bid)
    g.add_task(1, _task(0, 2, 10))  # (its worker's next incarnation, say)
    assert workers.loads() == [b"\x01", b"\x01"]


# -- tasks, workers and seeds ----------------------------------------------------------------------
def test_a_worker_is_set_to_a_tasks_seed_and_epoch_only_when_it_is_not_already():
    g, _, workers = _group(n=2)
    g.attach(1, RANK_A)
    g.add_task(1, _task(0, 1, 10, index=b"\x01", seed=5, epoch=2, fmt=3))
    g.add_task(1, _task(1, 1, 11, index=b"\x02", seed=0, epoch=0, fmt=1))
    assert workers.fmts == {workers.sent()[0][1]: 3, workers.sent()[1][1]: 1}
    # worker 0 was set to (5, 2); worker 1 started with the config's seed (0, 0): set to nothing
    ((slot, epoch, payload),) = workers.epochs
    assert (slot, epoch) == (0, 2) and protocol.decode_resume(payload) == (5, None, {})
    workers.script.append(events.BatchReady(0, workers.sent()[0][1], FakePending()))
    workers.script.append(lambda: g.add_task(1, _task(0, 1, 12, index=b"\x03", seed=5, epoch=2)))
    _drive(g)
    assert workers.sent()[-1][0] == 0 and len(workers.epochs) == 1  # (still set to it)


def test_a_joined_task_loads_one_at_a_time_when_any_asker_asked_so():
    g, _, workers = _group(n=1)
    g.attach(1, RANK_A)
    g.attach(2, RANK_B)
    g.add_task(1, _task(0, 1, 9, index=b"\x09"))  # (the worker is busy with it)
    g.add_task(1, _task(0, 1, 10))
    g.add_task(2, _task(1, 1, 20, serial=True))  # (re-issued after a death: one at a time)
    workers.script.append(events.BatchReady(0, workers.last(), FakePending()))
    _drive(g)
    assert workers.loads() == [b"\x09", b"\x01"] and workers.serial[workers.last()] is True


def test_a_task_nobody_wants_but_a_worker_loads_is_joined_by_the_next_asker():
    g, pool, workers = _group(n=2)
    g.attach(1, RANK_A)
    g.attach(2, RANK_B)
    g.add_task(1, _task(0, 1, 10))
    g.forget(1, 0, 1)  # (A's worker died meanwhile)
    g.add_task(2, _task(3, 1, 20))  # the same batch: the load going on is B's now
    assert len(workers.sent()) == 1
    workers.script.append(events.BatchReady(0, workers.last(), FakePending()))
    _drive(g)
    assert pool.to(1, wire.Batch) == [] and [b.task for b in pool.to(2, wire.Batch)] == [20]


def test_a_queued_task_a_rank_still_wants_is_joined_not_loaded_twice():
    g, pool, workers = _group(n=1)
    g.attach(1, RANK_A)
    g.attach(2, RANK_B)
    g.add_task(1, _task(0, 1, 9, index=b"\x09"))  # (the worker is busy with it)
    g.add_task(1, _task(1, 1, 10))  # queued, in A's queue
    g.add_task(2, _task(3, 1, 20))  # joined by B
    g.forget(1, 1, 1)  # A's worker 1 died: B still wants it
    g.add_task(2, _task(4, 1, 21))  # B's other worker asks for the same batch: joined
    workers.script.append(events.BatchReady(0, workers.last(), FakePending()))
    workers.script.append(lambda: events.BatchReady(0, workers.last(), FakePending()))
    _drive(g)
    assert workers.loads() == [b"\x09", b"\x01"]
    assert sorted(b.task for b in pool.to(2, wire.Batch)) == [20, 21]


def test_a_shared_task_of_a_rank_that_left_waits_behind_the_other_ranks_own():
    g, _, workers = _group(n=1)
    g.attach(1, RANK_A)
    g.attach(2, RANK_B)
    g.add_task(1, _task(0, 1, 9, index=b"\x09"))  # (the worker is busy with it)
    g.add_task(1, _task(0, 1, 10, index=b"\x01"))  # A's, joined by B below
    g.add_task(2, _task(0, 1, 20, index=b"\x02"))  # B's own
    g.add_task(2, _task(1, 1, 21, index=b"\x01"))
    g.detach(1)
    workers.script.append(events.BatchReady(0, workers.last(), FakePending()))
    workers.script.append(lambda: events.BatchReady(0, workers.last(), FakePending()))
    _drive(g)
    assert workers.loads() == [b"\x09", b"\x02", b"\x01"]


def test_forgetting_keeps_the_newest_incarnation_forgotten():
    g, _, workers = _group(n=2)
    g.attach(1, RANK_A)
    g.forget(1, 0, 3)
    g.forget(1, 0, 1)  # (an older death heard late)
    g.forget(1, 1, 0)
    g.forget(9, 0, 5)  # (a connection not attached: nothing)
    g.add_task(1, _task(0, 2, 10, index=b"\x01"))  # forgotten
    g.add_task(1, _task(0, 4, 11, index=b"\x02"))
    g.add_task(1, _task(1, 1, 12, index=b"\x03"))  # incarnation 1 of w 1 lives
    assert workers.loads() == [b"\x02", b"\x03"]


# -- deaths ----------------------------------------------------------------------------------------
def test_a_task_re_issued_after_its_workers_death_is_loaded_again():
    g, pool, workers = _group(n=1)
    g.attach(1, RANK_A)
    g.add_task(1, _task(0, 1, 10))
    workers.script.extend([
        _exited(0, started=True, task=workers.last()),
        lambda: g.add_task(1, _task(0, 2, 10)),  # the same task, by the next incarnation
    ])
    _drive(g)
    assert len(pool.to(1, wire.Died)) == 1
    assert workers.loads() == [b"\x01", b"\x01"]


def test_deaths_of_workers_past_their_start_up_never_break_the_group():
    g, pool, workers = _group(n=1)
    g.attach(1, RANK_A)
    g.add_task(1, _task(0, 1, 10))
    for gen in (2, 3, 4):  # (each dies loading with an exit status, and is re-issued)
        workers.script.extend([
            lambda: _exited(0, started=True, signum=0, code=1, task=workers.last()),
            lambda gen=gen: g.add_task(1, _task(0, gen, 10)),
        ])
    _drive(g)
    assert g.broken is None
    assert [(d.gen, d.exited.restartable) for d in pool.to(1, wire.Died)] == \
        [(1, True), (2, True), (3, True)]
    assert len(workers.sent()) == 4


def test_a_few_kills_at_start_up_do_not_break_the_group():
    g, pool, workers = _group(n=1)
    g.attach(1, RANK_A)
    g.add_task(1, _task(0, 1, 10))
    for _ in range(3):  # (the OOM killer, three times)
        workers.script.append(_exited(0, started=False, signum=9))
    _drive(g)
    assert g.broken is None and pool.to(1, wire.Died) == []
    assert workers.loads() == [b"\x01"] * 4


@pytest.mark.parametrize("outcome_first", [False, True])
def test_kills_at_start_up_break_the_group_only_without_progress_for_the_grace(clock,
                                                                              outcome_first):
    g, pool, workers = _group(n=1)
    g.attach(1, RANK_A)
    if outcome_first:  # (progress: an outcome; the kills count from then)
        clock[0] = 1100.0
        g.add_task(1, _task(0, 1, 9, index=b"\x09"))
        workers.script.append(events.BatchReady(0, workers.last(), FakePending()))
    workers.script.append(lambda: g.add_task(1, _task(0, 1, 10)))
    for _ in range(12):  # (3 s apart: every pause before a restart has passed)
        workers.script.extend([lambda: clock.__setitem__(0, clock[0] + 3),
                               _exited(0, started=False, signum=9)])
    _drive(g)
    assert g.broken is None and pool.to(1, wire.Died) == []
    clock[0] += 60  # no progress for the grace, through ten kills and more: broken
    workers.script.append(_exited(0, started=False, signum=9))
    _drive(g)
    assert g.broken is not None and not g.broken.restartable
    (died,) = pool.to(1, wire.Died)
    assert died.exited.cause == "was killed" and not died.exited.restartable


def test_a_broken_group_tells_every_rank_waiting_the_workers_own_death():
    g, pool, workers = _group(n=1)
    g.attach(1, RANK_A)
    g.attach(2, RANK_B)
    g.add_task(1, _task(0, 1, 10, index=b"\x01"))
    g.add_task(2, _task(5, 1, 20, index=b"\x02"))  # (queued)
    for _ in range(3):
        workers.script.append(_exited(0, started=False, signum=0, code=1))
    _drive(g)
    for cid, w in ((1, 0), (2, 5)):
        (died,) = pool.to(cid, wire.Died)
        assert died.w == died.exited.worker == w
        assert (died.exited.cause, died.exited.exit_code, died.exited.restartable) == \
            ("was killed", 1, False)


def test_an_error_waiting_on_the_workers_breaks_the_group_and_every_rank_waiting_hears_it(clock):
    g, pool, workers = _group(n=1)
    g.attach(1, RANK_A)
    g.attach(2, RANK_B)
    g.add_task(1, _task(0, 1, 10, index=b"\x01"))
    g.add_task(2, _task(5, 1, 20, index=b"\x02"))  # (queued)
    went_on = []
    workers.script.extend([OSError("slot table overwritten"), lambda: went_on.append(1),
                           OSError("a second error")])
    _drive(g)
    assert went_on == [1]  # (its loop went on waiting)
    for cid in (1, 2):
        (died,) = pool.to(cid, wire.Died)
        assert "slot table overwritten" in died.exited.cause and not died.exited.restartable
    g.add_task(1, _task(1, 1, 11, index=b"\x03"))  # the first verdict answers what comes next
    assert "slot table overwritten" in pool.to(1, wire.Died)[-1].exited.cause


def test_an_error_handling_an_event_breaks_the_group():
    g, pool, workers = _group(n=1)
    g.attach(1, RANK_A)
    g.add_task(1, _task(0, 1, 10))
    workers.script.append(events.BatchReady(7, 1, FakePending()))  # (no such slot)
    _drive(g)
    (died,) = pool.to(1, wire.Died)
    assert "IndexError" in died.exited.cause and g.broken is not None


def test_a_death_is_told_once_per_incarnation_and_never_to_a_connection_that_left():
    g, pool, _ = _group()
    g.attach(1, RANK_A)
    assert g.kill_targets(1, 3, 1, Hung(None, 30.0, None)) == []
    assert g.kill_targets(1, 3, 1, Hung(None, 30.0, None)) == []
    assert [d.w for d in pool.to(1, wire.Died)] == [3]
    assert g.kill_targets(9, 3, 1, Hung(None, 30.0, None)) == []
    g.tell_failed(9, _task(0, 1, 10), ValueError("unreadable"))
    assert [c for c, _ in pool.out if c == 9] == []


def test_a_message_the_pool_could_not_handle_kills_its_virtual_worker():
    g, pool, workers = _group()
    g.attach(1, RANK_A)
    g.add_task(1, _task(2, 1, 30))
    g.tell_failed(1, _task(2, 1, 31, index=b"\x05"), ValueError("unreadable"))
    (died,) = pool.to(1, wire.Died)
    assert (died.w, died.gen, died.exited.worker) == (2, 1, 2)
    assert "task" in died.exited.cause and "unreadable" in died.exited.cause
    assert "worker 2 " in died.exited.explanation
    g.add_task(1, _task(2, 1, 32, index=b"\x06"))  # (that incarnation is forgotten)
    g.add_task(1, _task(2, 2, 33, index=b"\x07"))
    assert workers.loads() == [b"\x01", b"\x07"]
    # a message of no virtual worker's (no worker, or no incarnation): nobody dies
    g.tell_failed(1, types.SimpleNamespace(w=7), ValueError("unreadable"))
    g.tell_failed(1, types.SimpleNamespace(gen=1), ValueError("unreadable"))
    assert len(pool.to(1, wire.Died)) == 1


@pytest.mark.parametrize("where", ["start", "send"])
def test_a_task_that_could_not_be_given_to_a_worker_dies_alone(where):
    g, pool, workers = _group(n=1)
    g.attach(1, RANK_A)
    g.attach(2, RANK_B)
    (workers.fail_start if where == "start" else workers.fail_send).append(
        OSError("the fork failed"))
    g.add_task(1, _task(0, 1, 10, index=b"\x01"))
    (died,) = pool.to(1, wire.Died)
    assert (died.w, died.gen) == (0, 1)
    assert "task" in died.exited.cause and "the fork failed" in died.exited.cause
    assert "worker 0 " in died.exited.explanation
    assert g.budget._busy == 0
    g.add_task(1, _task(0, 2, 10, index=b"\x01"))  # re-issued: loaded, by the same worker
    assert workers.sent() and workers.loads() == [b"\x01"] and g.budget._busy == 1


# -- hangs -----------------------------------------------------------------------------------------
def test_kill_takes_a_stack_only_for_a_hang_without_one():
    g, _, workers = _group()
    g.kill([(0, Hung(3, 30.0, "")), (1, Hung(4, 30.0, "its own stack"))])
    assert [(slot, h.index, h.stack) for slot, h in workers.killed] == \
        [(0, 3, "stack of slot 0"), (1, 4, "its own stack")]
    assert ("capture_stack", 1) not in workers.calls


def test_a_hang_target_keeps_the_index_the_rank_named_and_needs_no_report():
    g, _, workers = _group()
    g.attach(1, RANK_A)
    g.add_task(1, _task(0, 1, 10))
    assert [(s, h.index) for s, h in g.kill_targets(1, 0, 1, Hung(3, 30.0, None))] == [(0, 3)]
    del workers.views[0]  # (its process has no view now)
    assert [(s, h.index) for s, h in g.kill_targets(1, 0, 1, Hung(None, 30.0, None))] == \
        [(0, None)]


def test_a_worker_stuck_starting_is_killed_once_after_the_grace(clock):
    g, pool, workers = _group(n=1)
    workers.start_states.extend(["starting", "starting"])
    g.attach(1, RANK_A)
    g.add_task(1, _task(0, 1, 10))

    def at(t):
        clock[0] = t
        return _tick()

    workers.script.extend([lambda: at(1059.0), lambda: at(1061.0), lambda: at(1070.0)])
    _drive(g)
    ((slot, hung),) = workers.killed
    assert (slot, hung.index, hung.seconds, hung.stack) == (0, None, 61.0, "stack of slot 0")
    assert "starting" in hung.stuck
    # its death at start-up: the task goes to the next worker, killed in turn when stuck
    workers.script.extend([_exited(0, started=False, signum=9), lambda: at(1140.0)])
    _drive(g)
    assert [s for s, _ in workers.killed] == [0, 0] and workers.killed[1][1].seconds == 70.0
    assert pool.to(1, wire.Died) == [] and pool.to(1, wire.Began) == []


def test_began_is_told_once_when_the_worker_finishes_starting():
    g, pool, workers = _group(n=1)
    workers.start_states.append("starting")
    g.attach(1, RANK_A)
    g.add_task(1, _task(0, 1, 10))
    assert pool.to(1, wire.Began) == []

    def ready():
        workers.views[0].status = {"state": "loading", "index": 7}

    workers.script.extend([_tick(), ready, _tick(), _tick()])
    _drive(g)
    assert pool.to(1, wire.Began) == [wire.Began(0, 1, 10, 5000)]
    assert pool.to(1, wire.Died) == []


def test_a_worker_that_dies_starting_goes_back_to_the_front_and_the_next_one_tells_began():
    g, pool, workers = _group(n=1)
    workers.start_states.append("starting")
    g.attach(1, RANK_A)
    g.add_task(1, _task(0, 1, 10, index=b"\x01"))
    g.add_task(1, _task(0, 1, 11, index=b"\x02"))
    workers.script.extend([_exited(0, started=False, signum=9),
                           lambda: events.BatchReady(0, workers.last(), FakePending())])
    _drive(g)
    assert workers.loads() == [b"\x01", b"\x01", b"\x02"]
    assert pool.to(1, wire.Began)[0] == wire.Began(0, 1, 10, 5001)


def test_a_worker_with_no_report_yet_has_not_begun_and_an_unknown_pid_is_0():
    g, pool, workers = _group(n=1)
    workers.with_view = False
    g.attach(1, RANK_A)
    g.add_task(1, _task(0, 1, 10))
    assert len(workers.sent()) == 1 and pool.to(1, wire.Began) == []

    def report():
        workers.views[0] = types.SimpleNamespace(pid=None, status={"state": "loading"})

    workers.script.extend([_tick(), report, _tick(),
                           lambda: events.BatchReady(0, workers.last(), FakePending())])
    _drive(g)
    assert pool.to(1, wire.Began) == [wire.Began(0, 1, 10, 0)]
    assert [b.pid for b in pool.to(1, wire.Batch)] == [0] and pool.to(1, wire.Died) == []


# -- the node's budget -----------------------------------------------------------------------------
def test_a_group_waits_in_line_for_a_token_and_leaves_the_line_with_nothing_to_do():
    budget = Budget(1)
    g1, _, w1 = _group(n=1, budget=budget)
    g1.attach(1, RANK_A)
    g1.add_task(1, _task(0, 1, 10))  # (the one token)
    waiting = []
    for tally in (3, 1, 2):
        g, pool, _ = _group(n=1, budget=budget)
        g.attach(2, RANK_B)
        pool.tally[RANK_B] = tally
        g.add_task(2, _task(0, 1, 20))
        waiting.append(g)
    w1.script.append(events.BatchReady(0, w1.last(), FakePending()))
    _drive(g1)  # (its token given back)
    assert budget.waiting() == [waiting[1], waiting[2], waiting[0]]  # furthest behind first
    waiting[1].forget(2, 0, 1)
    waiting[1].dispatch()  # (woken with nothing left to do)
    waiting[2].detach(2)  # (its only rank left)
    assert budget.waiting() == [waiting[0]]
    waiting[0].close()
    assert budget.waiting() == []
