"""The pool's end of its template's link (placements/node/forker.py), over a socketpair whose
other end plays the template with link.py's messages. No process is forked."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from stoker.placements.node import forker, link, wire

pytestmark = pytest.mark.unit


@pytest.fixture
def pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    yield a, b
    a.close()
    b.close()


def test_a_fork_is_answered_with_its_pid_and_a_descriptor_then_its_exit_status(pair):
    pool_end, template_end = pair
    wire.send(template_end, link.Started(4321))
    lk = forker.Link(pool_end)
    assert lk.alive and lk.pid == 4321
    asked = []

    def template():
        message, fds = wire.recv(template_end)
        asked.append((message, fds))
        r, w = os.pipe()
        wire.send(template_end, link.Forked(message.rid, 777), [r])
        os.close(r)
        os.close(w)
        wire.send(template_end, link.Exited(777, -9))

    t = threading.Thread(target=template)
    t.start()
    r, w = os.pipe()
    try:
        pid, pidfd = lk.fork(b"the Process", [r])
    finally:
        os.close(r)
        os.close(w)
    t.join(10)
    ((message, fds),) = asked
    assert isinstance(message, link.Fork) and message.payload == b"the Process"
    assert len(fds) == 1
    wire.close_all(fds)
    assert pid == 777
    os.close(pidfd)
    assert lk.status(777, 10) == -9
    template_end.shutdown(socket.SHUT_RDWR)  # the template ended: the link is dead
    deadline = time.monotonic() + 10
    while lk.alive and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not lk.alive and lk.status(778, 0) is None


def test_a_template_that_does_not_say_started_is_no_link(pair):
    pool_end, template_end = pair
    wire.send(template_end, link.Exited(1, 0))
    assert not forker.Link(pool_end).alive


def test_the_messages_are_frozen_values():
    m = link.Forked(1, 2)
    assert m == link.Forked(1, 2) and (m.rid, m.pid) == (1, 2)
    with pytest.raises(AttributeError):
        m.pid = 3
    assert link.Fork in link.POOL_SENDS and link.Exited in link.TEMPLATE_SENDS
