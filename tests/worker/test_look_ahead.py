"""The worker loop owns its look-ahead (worker/loop.py over fetch.Loading and inflight.Batch):
as its task's samples are done, the loop reads the channel and starts the next task's samples
on the places left free; a serial task is loaded one at a time on the loop's thread and never
started ahead. A loop over a fake channel, on the test's thread: no process."""

from __future__ import annotations

import collections
import os
import threading

import pytest

from stoker.config.load import LoadSettings
from stoker.wire import protocol as p
from stoker.worker.fetch import MAP
from stoker.worker.loop import WorkerConfig, WorkerLoop

pytestmark = pytest.mark.unit

WAIT_S = 10


class Channel:
    """A ChannelEndpoint whose messages are queued here; its fd is readable while any wait."""

    def __init__(self, messages):
        self._r, self._w = os.pipe()
        self.fd = self._r
        self.inbox = collections.deque(messages)
        os.write(self._w, b"m" * len(messages))
        self.sent: list = []
        self.batches: list = []
        self.entered: list = []

    def receive(self):
        if not self.inbox:
            return None
        os.read(self._r, 1)
        return self.inbox.popleft()

    def close(self):
        os.close(self._r)
        os.close(self._w)

    def enter(self, state, task, index, position=-1):
        self.entered.append((state, task, index))

    def add_sample(self):
        pass

    def set_in_flight(self, n):
        pass

    def mark_ready(self, cpu_s, runqueue_s):
        pass

    def update_rss(self):
        pass

    def set_shared_memory_limit(self, cap, patience):
        pass

    def send(self, mtype, task, a=0, payload=b""):
        self.sent.append((mtype, task, a, payload))

    def send_batch(self, task, obj, mode, indices=None):
        self.batches.append((task, list(obj)))
        return True


def task(number, index, serial=False):
    fmt, payload = p.encode_index(index)
    return (p.MSG_TASK, number, fmt, int(serial), payload)


class Recorded:
    """Counts each index's loads and their threads; index 7 (task 0's last) waits until index
    8 (task 1's first) has started: only a loop that reads ahead lets it finish."""

    def __init__(self, wait_s=WAIT_S):
        self.wait_s = wait_s
        self.lock = threading.Lock()
        self.calls: collections.Counter = collections.Counter()
        self.thread: dict = {}
        self.started_8 = threading.Event()
        self.task1_done_before: set = set()

    def __len__(self):
        return 20

    def __getitem__(self, i):
        with self.lock:
            self.calls[i] += 1
            self.thread[i] = threading.get_ident()
        if i == 8:
            self.started_8.set()
        if i == 7 and not self.started_8.wait(self.wait_s):
            raise TimeoutError("task 1 was not started ahead while task 0 loaded")
        return i


def serve(ds, messages, threads=4):
    ch = Channel(messages)
    config = WorkerConfig(num_workers=1, kind=MAP, dataset=ds, auto_collation=True,
                          collate_fn=list, collate_mode=p.MODE_AS_IS, drop_last=False,
                          base_seed=0, load=LoadSettings(threads=threads))
    loop = WorkerLoop(ch, 0, config)
    loop.fetcher = loop._new_fetcher({})  # noqa: SLF001 (prepare() would seed this process)
    try:
        loop.serve()
    finally:
        loop.fetcher.close()
        ch.close()
    return ch


def test_the_loop_starts_the_next_task_ahead_and_loads_a_serial_one_alone():
    ds = Recorded()
    ch = serve(ds, [task(0, list(range(8))), task(1, list(range(8, 16))),
                    task(2, list(range(16, 20)), serial=True), (p.MSG_STOP, 0, 0, 0, b"")])
    assert [m for m in ch.sent if m[0] == p.MSG_ERROR] == []
    assert ch.batches == [(0, list(range(8))), (1, list(range(8, 16))), (2, list(range(16, 20)))]
    assert set(ds.calls.values()) == {1} and len(ds.calls) == 20  # each loaded once
    me = threading.get_ident()
    assert all(ds.thread[i] != me for i in range(16))  # at once, on the gate's threads
    assert all(ds.thread[i] == me for i in range(16, 20))  # serial: on the loop's thread
    named = [index for state, t, index in ch.entered
             if state == p.STATE_FETCHING and t == 2 and index is not None]
    assert named == [16, 17, 18, 19]  # one at a time, the status page names each
    assert not [i for state, t, i in ch.entered if state == p.STATE_FETCHING and t < 2
                and i is not None]  # at once, it names none


def test_a_serial_task_is_not_started_ahead_and_stops_the_look_ahead():
    """Task 1 is serial: while task 0 loads, the loop reads it and starts nothing (index 7 then
    waits its 0.5 s out: task 0 fails, reported in order), and task 2 behind it waits too."""
    ds = Recorded(wait_s=0.5)
    ch = serve(ds, [task(0, list(range(8))), task(1, [8, 9], serial=True),
                    task(2, [10, 11]), (p.MSG_STOP, 0, 0, 0, b"")])
    errors = [m[1] for m in ch.sent if m[0] == p.MSG_ERROR]
    assert errors == [0]  # (index 7 waited for an 8 that was never started ahead)
    assert ch.batches == [(1, [8, 9]), (2, [10, 11])]
    me = threading.get_ident()
    assert ds.thread[8] == me and ds.thread[9] == me
    assert set(ds.calls.values()) == {1}
