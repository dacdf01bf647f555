"""The node pool's frames carry their protocol version in the header (placements/node/wire.py):
a peer of another version is named as such, before anything of its frame is unpickled, on both
ends (the pool answers it; the rank raises naming both versions). Socketpairs in this process,
no pool started."""

from __future__ import annotations

import os
import pickle
import socket
import struct
import types

import pytest

from stoker.common.errors import EngineError
from stoker.placements.node import session, wire, workers

pytestmark = pytest.mark.unit


@pytest.fixture
def pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    yield a, b
    a.close()
    b.close()


def _frame(version: int, message) -> bytes:
    return b"SK" + struct.pack("<H", version) + b"I" + pickle.dumps(message)


def test_a_frame_of_another_version_is_a_mismatch_naming_both(pair):
    a, b = pair
    a.send(_frame(wire.VERSION + 1, wire.Release(1)))
    with pytest.raises(wire.VersionMismatch) as info:
        wire.recv(b)
    assert (info.value.theirs, info.value.ours) == (wire.VERSION + 1, wire.VERSION)
    text = info.value.for_rank("name:j")
    assert text.startswith(f"stoker: the node pool speaks protocol {wire.VERSION + 1}, this "
                           f"rank {wire.VERSION}: a pool from another stoker version is running "
                           "for this job (name:j)")
    assert "placement=stoker.Node(name=...)" in text


def test_the_version_is_read_before_the_message_is_unpickled(pair):
    a, b = pair
    a.send(b"SK" + struct.pack("<H", 99) + b"I" + b"not a pickle")
    with pytest.raises(wire.VersionMismatch) as info:
        wire.recv(b)
    assert info.value.theirs == 99


def test_a_frame_of_version_2_which_had_no_version_in_it(pair):
    a, b = pair
    a.send(b"I" + pickle.dumps(("hello",)))
    with pytest.raises(wire.VersionMismatch) as info:
        wire.recv(b)
    assert info.value.theirs == 2
    a.send(b"M" + struct.pack("<Q", 10))
    with pytest.raises(wire.VersionMismatch, match="frame of protocol 2, this process speaks"):
        wire.recv(b)


def test_a_frame_of_no_stoker_is_a_mismatch_of_no_version(pair):
    a, b = pair
    a.send(b"GET / HTTP/1.1\r\n")
    with pytest.raises(wire.VersionMismatch) as info:
        wire.recv(b)
    assert info.value.theirs is None
    assert "speaks protocol no version of it, this rank" in info.value.for_rank("j")


def test_a_mismatched_frames_descriptors_are_closed(pair):
    a, b = pair
    r, w = os.pipe()
    try:
        socket.send_fds(a, [_frame(wire.VERSION + 1, "x")], [r])
        before = set(os.listdir("/proc/self/fd"))
        with pytest.raises(wire.VersionMismatch):
            wire.recv(b)
        assert set(os.listdir("/proc/self/fd")) == before
    finally:
        os.close(r)
        os.close(w)


def test_a_frame_of_this_version_reads(pair):
    a, b = pair
    a.send(_frame(wire.VERSION, wire.Release(7)))
    assert wire.recv(b) == (wire.Release(7), [])


class _Pool:
    def __init__(self):
        self.left, self.woken, self.joined = [], 0, []

    def leave(self, s):
        self.left.append(s)

    def wake(self):
        self.woken += 1

    def join(self, s, m, fds):
        self.joined.append(m)


def test_the_pool_refuses_a_rank_of_another_version_once_naming_both(pair):
    rank, pool_end = pair
    s = session.Session(1, pool_end, os.getpid() + 10**7)  # (no such pid: no pidfd to watch)
    queued = []
    s.put = lambda m, fds: queued.append(m)
    pool = _Pool()
    rank.send(_frame(wire.VERSION + 1, "hello"))
    rank.send(_frame(wire.VERSION + 1, "again"))  # (read on: answered once, not per frame)
    rank.shutdown(socket.SHUT_WR)
    session.read(pool, s)  # (returns at the connection's end)
    assert pool.left == [s] and pool.joined == []
    # (only a rank of this version could unpickle it; another reads its header)
    assert queued == [wire.Refused(f"the node pool speaks protocol {wire.VERSION}, this rank "
                                   f"{wire.VERSION + 1}")]


def test_a_rank_of_protocol_3_whose_load_settings_had_no_cpus_is_refused(pair):
    """Version 4: LoadSettings.cpus, which the pool sets for its workers. A rank of 3 (its
    hello's LoadSettings without it) gets an answer naming both, not a pool that leaves its
    workers 1 CPU each, nor a group of its own beside its job's ranks of 4."""
    from stoker.config.load import LoadSettings

    assert wire.VERSION == 4
    rank, pool_end = pair
    s = session.Session(1, pool_end, os.getpid() + 10**7)
    queued = []
    s.put = lambda m, fds: queued.append(m)
    old = LoadSettings.__new__(LoadSettings)
    object.__setattr__(old, "__dict__", {"on_error": "raise", "max_retries": 3, "threads": 1})
    assert old.cpus == 1  # (it loads with the default...)
    # (...but pickles as it came: the group key, which hashes it, is not a rank of 4's)
    assert pickle.dumps(old) != pickle.dumps(LoadSettings())
    rank.send(_frame(3, ("hello", old)))
    rank.shutdown(socket.SHUT_WR)
    session.read(_Pool(), s)
    assert queued == [wire.Refused("the node pool speaks protocol 4, this rank 3")]


def test_a_rank_told_by_a_pool_of_another_version_raises_naming_both(pair, monkeypatch):
    rank, pool_end = pair
    monkeypatch.setattr(workers.rendezvous, "connect", lambda job: (rank, os.getpid()))
    monkeypatch.setattr(workers.hello, "make", lambda config, n: (
        wire.Release(0), types.SimpleNamespace(fds=lambda: [], close=lambda: None)))
    nw = workers.NodeWorkers(types.SimpleNamespace(name="j", workers=2), 1)
    pool_end.send(_frame(wire.VERSION + 1, wire.Refused("why")))  # (the pool's answer)
    with pytest.raises(EngineError) as info:
        nw._join(object())
    assert str(info.value).startswith(
        f"stoker: the node pool speaks protocol {wire.VERSION + 1}, this rank {wire.VERSION}: "
        "a pool from another stoker version is running for this job (name:j)")
    assert wire.recv(pool_end)[0] == wire.Release(0)  # (its hello went, in this version)
    nw._drop_conn()


def test_a_rank_whose_pool_never_answers_names_an_older_pool(pair, monkeypatch):
    """A pool of stoker 0.2 (node protocol 2) reads a newer frame as a broken pickle and never
    answers: the rank says so once its patience ends, instead of retrying as if the pool had
    ended."""
    rank, pool_end = pair
    monkeypatch.setattr(workers.rendezvous, "connect", lambda job: (rank, os.getpid()))
    monkeypatch.setattr(workers.hello, "make", lambda config, n: (
        wire.Release(0), types.SimpleNamespace(fds=lambda: [], close=lambda: None)))
    monkeypatch.setattr(workers, "HELLO_TIMEOUT_S", 0.2)
    nw = workers.NodeWorkers(types.SimpleNamespace(name="j", workers=2), 1)
    with pytest.raises(EngineError) as info:
        nw._join(object())
    assert str(info.value).startswith(
        "stoker: the node pool running for this job (name:j) took this loader but did not answer "
        "in 0 s. A pool of an older stoker (node protocol 2 or earlier; this rank speaks "
        f"{wire.VERSION})")
    nw._drop_conn()


def test_the_mismatch_says_what_to_do_in_full():
    assert wire.VersionMismatch(7, 3).for_rank("name:j") == (
        "stoker: the node pool speaks protocol 7, this rank 3: a pool from another stoker "
        "version is running for this job (name:j). Run every rank of a job with the same "
        "stoker; the other pool (processes named stoker-pool) exits once its last rank has gone, "
        "or give this job a name of its own (placement=stoker.Node(name=...)).")
    assert str(wire.VersionMismatch(None, 3)) == (
        "a node-pool frame of protocol ?, this process speaks 3")
    assert "speaks protocol no version of it," in wire.VersionMismatch(None, 3).for_rank("j")
