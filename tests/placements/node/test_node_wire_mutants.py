"""stoker.placements.node.wire: the node pool's socket, its name and its messages, over a
socketpair in this process."""

from __future__ import annotations

import array
import hashlib
import os
import pickle
import socket
import struct
import threading

import pytest

from stoker.placements.node import wire

pytestmark = pytest.mark.unit  # no process (tests/support/tiers.py)

HEAD = b"SK" + struct.pack("<H", 4)  # every frame's header: its protocol version


@pytest.fixture
def pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    yield a, b
    a.close()
    b.close()


def _open(fd) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def _digest(mnt, job: str) -> str:
    return hashlib.sha256(f"{mnt}:{job}".encode("utf-8", "replace")).hexdigest()[:20]


def test_the_address_is_the_users_and_the_jobs_in_this_mount_namespace():
    mnt = os.stat("/proc/self/ns/mnt").st_ino
    want = f"\0stoker-node-{os.getuid()}-{_digest(mnt, 'job:1')}".encode()
    assert wire.address("job:1") == want
    assert wire.address_for(os.getuid(), "job:1") == want
    assert wire.address_for(4242, "job:1") == f"\0stoker-node-4242-{_digest(mnt, 'job:1')}".encode()
    assert len(_digest(mnt, "x")) == 20
    assert wire.address_for(1, "a") != wire.address_for(1, "b")


def test_a_job_name_that_is_no_text_still_names_a_pool():
    mnt = os.stat("/proc/self/ns/mnt").st_ino
    job = "bad\udc80name"  # a lone surrogate (from os.fsdecode of bytes): replaced
    assert wire.address_for(7, job) == f"\0stoker-node-7-{_digest(mnt, job)}".encode()


def test_without_a_mount_namespace_to_read_the_address_uses_0(monkeypatch):
    real = os.stat

    def stat(path, *a, **k):
        if path == "/proc/self/ns/mnt":
            raise FileNotFoundError(path)
        return real(path, *a, **k)

    monkeypatch.setattr(wire.os, "stat", stat)
    assert wire.address_for(7, "j") == f"\0stoker-node-7-{_digest(0, 'j')}".encode()


def test_a_new_socket_is_a_unix_seqpacket_one_closed_on_exec():
    s = wire.new_socket()
    try:
        assert s.family == socket.AF_UNIX and s.type == socket.SOCK_SEQPACKET
        assert not s.get_inheritable()
        assert s.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE) == socket.SOCK_SEQPACKET
    finally:
        s.close()


def test_the_peer_is_this_process(pair):
    a, _ = pair
    assert wire.peer(a) == (os.getpid(), os.getuid(), os.getgid())
    assert wire.check_peer(a, "the pool") == os.getpid()


def test_a_peer_of_another_user_is_refused(pair, monkeypatch):
    a, _ = pair
    monkeypatch.setattr(wire, "peer", lambda sock: (77, os.getuid() + 1, 0))
    with pytest.raises(wire.PeerRefused) as info:
        wire.check_peer(a, "the pool")
    assert str(info.value) == (f"the pool (pid 77) runs as uid {os.getuid() + 1}, not as this "
                               f"process's uid {os.getuid()}")


def test_readable_now_later_and_forever(pair):
    a, b = pair
    assert wire.readable(a, 0) is False
    assert wire.readable(a.fileno(), 0.05) is False
    t = threading.Timer(0.1, lambda: b.send(b"x"))
    t.start()
    try:
        assert wire.readable(a, 30) is True  # (waits for it: 100 ms, not 30 ms)
    finally:
        t.join()
    assert wire.readable(a, -1) is True
    assert wire.readable(a, 0) is True


def test_readable_waits_when_told_a_negative_time(pair):
    a, b = pair
    t = threading.Timer(0.1, lambda: b.send(b"x"))
    t.start()
    try:
        assert wire.readable(a, -0.5) is True
    finally:
        t.join()


def test_a_small_message_goes_inline(pair):
    a, b = pair
    wire.send(a, ("hello", 1, {"k": [1, 2]}))
    raw = b.recv(wire.INLINE_MAX + 64)
    assert raw == HEAD + b"I" + pickle.dumps(("hello", 1, {"k": [1, 2]}), protocol=5)
    wire.send(a, wire.Release(5))
    assert wire.recv(b) == (wire.Release(5), [])


def _exactly(n: int) -> bytes:
    """bytes whose pickle is exactly n bytes long."""
    for k in range(n, 0, -1):
        if len(pickle.dumps(b"x" * k, protocol=pickle.HIGHEST_PROTOCOL)) == n:
            return b"x" * k
    raise AssertionError(n)


def test_a_message_of_inline_max_goes_inline_and_one_byte_more_in_a_memfd(pair):
    a, b = pair
    msg = _exactly(wire.INLINE_MAX)
    wire.send(a, msg)
    raw = b.recv(wire.INLINE_MAX + 64)
    assert raw[:5] == HEAD + b"I" and len(raw) == len(HEAD) + wire.INLINE_MAX + 1
    more = _exactly(wire.INLINE_MAX + 1)
    wire.send(a, more)
    raw, fds, _, _ = socket.recv_fds(b, wire.INLINE_MAX + 64, 8)
    try:
        assert raw == HEAD + b"M" + struct.pack("<Q", wire.INLINE_MAX + 1) and len(fds) == 1
        assert pickle.loads(os.pread(fds[0], wire.INLINE_MAX + 1, 0)) == more
    finally:
        wire.close_all(fds)


def test_a_large_message_comes_back_whole_with_its_descriptors(pair):
    a, b = pair
    big = {"tb": "x" * (3 * wire.INLINE_MAX), "n": list(range(50_000))}
    r, w = os.pipe()
    try:
        before = len(os.listdir("/proc/self/fd"))
        wire.send(a, big, fds=[r, w])
        assert _open(r) and _open(w)  # (the caller's still)
        assert len(os.listdir("/proc/self/fd")) == before  # the memfd was closed
        got, fds = wire.recv(b)
        assert got == big and len(fds) == 2
        assert len(os.listdir("/proc/self/fd")) == before + 2  # (and the received memfd)
        os.write(fds[1], b"!")
        assert os.read(r, 1) == b"!"
        wire.close_all(fds)
    finally:
        os.close(r)
        os.close(w)


def test_descriptors_beside_a_small_message(pair):
    a, b = pair
    r, w = os.pipe()
    try:
        wire.send(a, ("fds",), fds=(w,))
        got, fds = wire.recv(b)
        assert got == ("fds",) and isinstance(fds, list) and len(fds) == 1
        assert not os.get_inheritable(fds[0])  # (MSG_CMSG_CLOEXEC)
        os.write(fds[0], b"?")
        assert os.read(r, 1) == b"?"
        wire.close_all(fds)
    finally:
        os.close(r)
        os.close(w)


def test_the_end_of_the_connection_is_none(pair):
    a, b = pair
    a.close()
    assert wire.recv(b) is None


def test_an_empty_message_with_descriptors_ends_it_and_closes_them(pair):
    a, b = pair
    r, w = os.pipe()
    try:
        a.sendmsg([b""], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [r]))])
        before = set(os.listdir("/proc/self/fd"))
        assert wire.recv(b) is None
        assert set(os.listdir("/proc/self/fd")) == before
    finally:
        os.close(r)
        os.close(w)


def test_a_truncated_message_is_an_error_and_its_descriptors_are_closed(pair):
    a, b = pair
    r, w = os.pipe()
    try:
        a.sendmsg([HEAD + b"I" + b"x" * (wire.INLINE_MAX + 100)],
                  [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [r]))])
        before = set(os.listdir("/proc/self/fd"))
        with pytest.raises(OSError, match="^stoker: a node-pool message was truncated$"):
            wire.recv(b)
        assert set(os.listdir("/proc/self/fd")) == before
    finally:
        os.close(r)
        os.close(w)


def test_too_many_descriptors_are_a_truncation(pair):
    a, b = pair
    fds = [os.dup(0) for _ in range(70)]
    try:
        a.sendmsg([HEAD + b"I" + pickle.dumps(1)],
                  [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        with pytest.raises(OSError, match="truncated"):
            wire.recv(b)
    finally:
        wire.close_all(fds)


def test_sixty_four_descriptors_pass(pair):
    a, b = pair
    fds = [os.dup(0) for _ in range(64)]
    try:
        wire.send(a, "many", fds=fds)
        got, back = wire.recv(b)
        assert got == "many" and len(back) == 64
        wire.close_all(back)
    finally:
        wire.close_all(fds)


def test_a_send_that_fails_closes_its_memfd(pair, monkeypatch):
    a, _ = pair
    before = set(os.listdir("/proc/self/fd"))

    def pwrite(fd, data, offset):
        raise OSError("full")

    monkeypatch.setattr(wire.os, "pwrite", pwrite)
    with pytest.raises(OSError, match="full"):
        wire.send(a, "x" * (2 * wire.INLINE_MAX))
    monkeypatch.undo()
    assert set(os.listdir("/proc/self/fd")) == before


def test_a_memfd_written_in_pieces(pair, monkeypatch):
    a, b = pair
    real = os.pwrite
    calls = []

    def pwrite(fd, data, offset):
        calls.append(offset)
        return real(fd, bytes(data[:1000]), offset)  # a short write each time

    monkeypatch.setattr(wire.os, "pwrite", pwrite)
    msg = bytes(range(256)) * 400
    wire.send(a, msg)
    monkeypatch.undo()
    got, fds = wire.recv(b)
    assert got == msg and fds == []
    assert calls[:3] == [0, 1000, 2000]


def test_close_all_closes_what_it_can():
    r, w = os.pipe()
    wire.close_all([r, 10**6, w])  # (an fd that is not open is passed over)
    assert not _open(r) and not _open(w)
    wire.close_all([])


def test_the_version_and_messages():
    assert wire.VERSION == 4  # (4: LoadSettings.cpus in a Hello's config)
    assert wire.Task(0, 1, 2, 0, b"", 5, 6).serial is False  # (its own field, not a bit of fmt)
    assert wire.Task(0, 1, 2, 0, b"", 5, 6, True).serial is True
    assert wire.Release(3).bid == 3
    assert wire.Ready(1, "j", 2, (3,), 1)._fields == ("pid", "job", "workers", "pids", "clients")


def test_credentials_beside_a_message_are_not_descriptors(pair):
    a, b = pair
    b.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)  # (the kernel adds SCM_CREDENTIALS)
    r, w = os.pipe()
    try:
        wire.send(a, "m", fds=[r])
        got, fds = wire.recv(b)
        assert got == "m" and len(fds) == 1
        wire.close_all(fds)
    finally:
        os.close(r)
        os.close(w)


def test_a_message_memfd_is_named_and_closed_on_exec(pair, monkeypatch):
    import fcntl

    a, b = pair
    real = os.pwrite
    seen = []

    def pwrite(fd, data, offset):
        seen.append((os.readlink(f"/proc/self/fd/{fd}"),
                     bool(fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC)))
        return real(fd, data, offset)

    monkeypatch.setattr(wire.os, "pwrite", pwrite)
    wire.send(a, "x" * (2 * wire.INLINE_MAX))
    monkeypatch.undo()
    assert seen[0] == ("/memfd:stoker-node-message (deleted)", True)
    got, fds = wire.recv(b)
    assert got == "x" * (2 * wire.INLINE_MAX) and fds == []
