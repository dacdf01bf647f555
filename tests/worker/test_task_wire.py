"""A task on the wire (wire/protocol.py, channel.h's kTask): its indices in words `a` and the
payload, ``serial`` (load one sample at a time) a word of its own, `b`. No bit of the index
format means anything else. One process: the channel is a socketpair, both ends here."""

from __future__ import annotations

import os
import pickle
import socket

import pytest

from stoker import _stoker
from stoker.wire import protocol as p

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("index", [[1, 2, 3], [5], (1, 2), "k", [True, 2], [2**70]])
@pytest.mark.parametrize("serial", [False, True])
def test_a_task_round_trips_with_its_serial_field(index, serial):
    fmt, payload = p.encode_index(index)
    t = p.decode_task(fmt, int(serial), payload)
    assert t == p.Task(index, serial) and t.index == index and t.serial is serial
    assert type(t.index) is type(index)


def test_no_bit_of_the_index_format_is_a_flag():
    assert not hasattr(p, "ONE_AT_A_TIME") and not hasattr(p, "encode_task")
    fmt, payload = p.encode_index([1, 2])
    assert fmt == 0 and p.encode_index(("a",))[0] == 1
    for word in (fmt | 256, 1 | 256, 2, 1 | 1024):  # the old bit, and any other: refused
        with pytest.raises(ValueError, match="index format"):
            p.decode_task(word, 0, pickle.dumps("x") if word & 1 else payload)
    assert p.decode_task(1, 0, pickle.dumps("x")) == ("x", False)


def test_serial_travels_in_its_own_word_over_the_channel():
    """The main process's Supervisor.send(..., b=serial) reaches the worker's receive() as the
    fourth word, the index format untouched beside it."""
    main_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sup = _stoker.Supervisor()
    sup.add_worker(0, main_end.detach(), os.getpid())
    ep = _stoker.WorkerEndpoint(worker_end.detach(), 0)
    try:
        for task, (index, serial) in enumerate([([4, 5], True), ([6], False), (("x", 1), True)]):
            fmt, payload = p.encode_index(index)
            sup.send(0, p.MSG_TASK, task, fmt, payload, b=int(serial))
            mtype, got_task, a, b, data = ep.receive()
            assert (mtype, got_task, a, b) == (p.MSG_TASK, task, fmt, int(serial))
            assert p.decode_task(a, b, data) == (index, serial)
        sup.send(0, p.MSG_TASK, 9, *p.encode_index([1]))  # b left out: not serial
        assert p.decode_task(*ep.receive()[2:]) == ([1], False)
    finally:
        sup.remove_worker(0)
