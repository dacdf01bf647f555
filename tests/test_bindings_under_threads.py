"""Every binding of the extension hammered from many threads at once (python/stoker/_ext/common.h
states the rules; each class its contract). The extension declares that it runs without the GIL,
so on a free-threaded Python these threads really run side by side: the free-threaded leg (make
test-ft) runs this file. With a GIL the threads are switched every few microseconds here
(sys.setswitchinterval), so calls still interleave wherever the binding lets Python code run.

What is checked: every result is exact (no lost update, no torn value); a container that
another thread changes while it is encoded comes out as it was at some moment, never as a crash
or a read of freed memory; a WorkerEndpoint refuses a second caller instead of sharing its
encoder. One process: no worker is started (unit tier).
"""

from __future__ import annotations

import os
import random
import socket
import sys
import threading

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

import stoker
from stoker import _stoker
from stoker.common.errors import EngineError
from stoker.wire import protocol
from support.compare import assert_same

pytestmark = pytest.mark.unit

THREADS = 8


@pytest.fixture(autouse=True)
def _switch_often():
    """With a GIL: a thread switch every 10 us, so calls interleave inside the bindings' Python
    calls too (no effect without a GIL)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(before)


def hammer(work, threads=THREADS):
    """Runs work(thread_number) on `threads` threads released at once; re-raises the first
    failure (an assert in a thread fails the test)."""
    start = threading.Barrier(threads)
    errors: list[BaseException] = []

    def run(n):
        start.wait()
        try:
            work(n)
        except BaseException as e:  # (re-raised below, in the test's thread)
            errors.append(e)

    ts = [threading.Thread(target=run, args=(n,)) for n in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]


class Churn:
    """A thread that keeps changing `target` (a list or a dict) until stopped: items appended and
    removed, keys added and deleted, the whole cleared now and then."""

    def __init__(self, target):
        self.target, self.stop = target, threading.Event()
        self.thread = threading.Thread(target=self._run)

    def _run(self):
        t, n = self.target, 0
        while not self.stop.is_set():
            n += 1
            if isinstance(t, list):
                t.append({"n": n, "s": "x" * (n % 7)})
                if len(t) > 40:
                    del t[: random.randrange(1, 40)]
                if n % 97 == 0:
                    t.clear()
            else:
                t[f"k{n % 50}"] = [n, "y" * (n % 5)]
                t.pop(f"k{(n * 7) % 50}", None)
                if n % 89 == 0:
                    t.clear()

    def __enter__(self):
        self.thread.start()
        return self.target

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


# -- SharedList -----------------------------------------------------------------------------------

ITEMS = [
    {"path": f"/data/{i}.jpg", "label": i % 10, "box": [i, i + 1.5], "meta": (None, True, b"\x00")}
    if i % 3 else [i, str(i) * (i % 5), {"deep": {"deeper": [i] * 3}}, 2**70 + i]
    for i in range(300)
]


def test_shared_list_reads_from_many_threads_are_exact():
    sl = stoker.SharedList(ITEMS)

    def read(n):
        order = list(range(len(ITEMS)))
        random.Random(n).shuffle(order)
        for _ in range(3):
            for i in order:
                assert sl[i] == ITEMS[i]
            assert sl[n::THREADS] == ITEMS[n::THREADS]

    hammer(read)


def test_shared_lists_built_at_once_from_items_another_thread_changes():
    items, shape = [], {"a": 1}
    with Churn([]) as moving_list, Churn({}) as moving_dict:
        items = [moving_list, {"fixed": 1, "moving": moving_dict}, shape]

        def build(n):
            for _ in range(30):
                sl = stoker.SharedList(items * 3)
                assert len(sl) == 9
                for k in range(0, 9, 3):
                    got_list, got_dict, got_shape = sl[k], sl[k + 1], sl[k + 2]
                    # as it was at some moment: items of the shapes the churn makes
                    assert all(isinstance(x, dict) and set(x) == {"n", "s"} for x in got_list)
                    assert set(got_dict) == {"fixed", "moving"} and got_dict["fixed"] == 1
                    assert all(k.startswith("k") and v[0] > 0
                               for k, v in got_dict["moving"].items())
                    assert got_shape == shape

        hammer(build)


# -- encode and decode -----------------------------------------------------------------------------

def batch_of(n):
    """A batch with every kind of leaf the wire lays out, different in each thread."""
    g = torch.Generator().manual_seed(n)
    return {
        "image": torch.rand(3, 8, 8, generator=g),
        "ints": torch.arange(n, n + 100, dtype=torch.int64),
        "half": torch.ones(4, 4, dtype=torch.bfloat16) * n,
        "strided": torch.arange(64.0).reshape(8, 8).t(),
        "np": np.full((5, 3), n, dtype=np.int16),
        "names": [f"s{n}-{i}" for i in range(10)],
        "big": 2**80 + n,
        "nested": (n, 1.5, None, True, b"raw" * n, {"deep": [n] * 3}),
    }


def test_encode_and_decode_from_many_threads_are_exact():
    def work(n):
        for r in range(40):
            batch = batch_of(n * 1000 + r)
            assert_same(_stoker.decode(_stoker.encode(batch, protocol.MODE_AS_IS)), batch)
            array = _stoker.encode_array(batch, protocol.MODE_AS_IS)
            assert_same(_stoker.decode_buffer(array), batch)

    hammer(work)


def test_collate_from_many_threads_matches_torch():
    def sample(n, i):
        return {"x": torch.full((3, 4), float(n * 100 + i)), "y": i, "w": 0.5 * i,
                "name": f"n{n}-{i}", "pair": (np.int32(i), torch.tensor([i, n]))}

    def work(n):
        for r in range(40):
            samples = [sample(n * 1000 + r, i) for i in range(16)]
            got = _stoker.decode(_stoker.encode(samples, protocol.MODE_COLLATE, list(range(16))))
            assert_same(got, default_collate(samples))

    hammer(work)


@pytest.mark.parametrize("mode", [protocol.MODE_AS_IS, protocol.MODE_CONVERT])
def test_encoding_containers_another_thread_changes(mode):
    """A list and a dict inside the batch change all the while: each encoding is some moment's
    view of them (the shapes the churn makes), and nothing freed is read."""
    with Churn([]) as moving_list, Churn({}) as moving_dict:
        batch = {"list": moving_list, "dict": moving_dict, "t": torch.ones(3)}

        def work(n):
            for _ in range(200):
                got = _stoker.decode(_stoker.encode(batch, mode))
                assert set(got) == {"list", "dict", "t"}
                assert all(set(x) == {"n", "s"} for x in got["list"])
                assert all(k.startswith("k") for k in got["dict"])

        hammer(work)


def test_collating_samples_another_thread_changes():
    """Dict samples whose keys come and go under the encoder: collated as some moment's keys,
    or refused with the KeyError that names the sample without one, as torch would; never a
    crash."""
    with Churn({}) as moving:
        def work(n):
            for _ in range(300):
                samples = [moving, dict(moving), dict(moving)]
                try:
                    got = _stoker.decode(_stoker.encode(samples, protocol.MODE_COLLATE))
                except KeyError as e:
                    assert "has no key" in str(e), e
                    continue
                assert all(k.startswith("k") and len(v) == 2 for k, v in got.items())

        hammer(work)


# -- the worker's endpoint and the main process's supervisor -----------------------------------------

def _pair():
    main_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sup = _stoker.Supervisor()
    sup.add_worker(0, main_end.detach(), os.getpid())
    return sup, _stoker.WorkerEndpoint(worker_end.detach(), 0)


def test_status_page_counts_every_sample_while_threads_write_and_read_it():
    sup, ep = _pair()
    try:
        ep.open_status(7)
        while sup.status(0) is None:  # the page travels as a message
            assert sup.wait(5.0) is None
        per_thread = 3000

        def work(n):
            for i in range(per_thread):
                if n % 4 == 0:  # readers: every read is a whole page
                    s = sup.status(0)
                    assert s["pid"] == os.getpid() and s["samples"] <= THREADS * per_thread
                    assert sum(s["seconds_in"].values()) >= 0
                elif n % 4 == 1:  # the loop's status calls, from several threads at once
                    ep.enter(protocol.STATE_FETCHING, i, i, i)
                    ep.set_in_flight(i % 5)
                    ep.add_sample()
                else:
                    ep.add_sample()

        hammer(work)
        writers = sum(1 for n in range(THREADS) if n % 4 != 0)
        assert sup.status(0)["samples"] == writers * per_thread
    finally:
        sup.remove_worker(0)


def test_a_second_caller_of_an_endpoint_is_refused_not_served():
    """receive() blocks in one thread; send() from another is refused at once (the endpoint has
    one caller) until receive() returns."""
    sup, ep = _pair()
    try:
        got = []

        def receive():
            while True:  # (refused itself while the main thread is in send())
                try:
                    got.append(ep.receive())
                    return
                except EngineError:
                    pass

        receiver = threading.Thread(target=receive)
        receiver.start()
        refused = None
        for _ in range(100_000):  # until the receiver is inside receive()
            try:
                ep.send(protocol.MSG_END, 1)
            except EngineError as e:
                refused = e
                break
            assert sup.wait(10.0)[:3] == ("message", 0, protocol.MSG_END)  # (drained)
        assert refused is not None and "one caller" in str(refused)
        sup.send(0, protocol.MSG_STOP, 3)
        receiver.join(60)
        assert not receiver.is_alive() and got[0][:2] == (protocol.MSG_STOP, 3)
        ep.send(protocol.MSG_END, 2)  # its turn is free again
    finally:
        sup.remove_worker(0)
