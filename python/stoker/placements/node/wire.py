"""How a rank and the node's pool talk: one SOCK_SEQPACKET connection per rank's iterator on an
abstract Unix socket named for the user and the job, messages of pickled plain tuples, and
descriptors (a batch's slot, the dataset's sealed memfd) beside them as SCM_RIGHTS.

- ``address(job)``: the socket's name, ``\\0stoker-node-<uid>-<hash of the job and of the
  mount namespace>``. An abstract
  name has no file and no permissions: who may talk is decided by the peer's credentials, read
  from the kernel (``SO_PEERCRED``) on both sides of every connection (``peer``): the pool
  accepts only its own user, a rank talks only to a pool of its own user.
- ``send`` / ``recv``: one message, its descriptors with it. A message larger than
  ``INLINE_MAX`` (an error's long traceback, a dataset's state) travels in a memfd, so no
  message ever meets the socket's size limit. Each frame's header carries ``VERSION``, read
  before anything is unpickled: a peer of another version is a ``VersionMismatch`` naming both
  (a changed message shape never reaches a rank as a dropped connection).

Both ends are processes of the same user, which trust each other (docs/design/node.md states
the threat model): a message is a pickle, as multiprocessing's own pipes are.

The messages are the table below, one ``NamedTuple`` per kind, imported by both ends. A pool
that reads a frame of another version answers ``Refused``; the rank reads the version in that
answer's header and raises, naming both.

Thread contract: ``send`` on one socket may be called from several threads only under the
caller's lock (a message is one ``sendmsg``, but the caller keeps its order); ``recv`` by one
thread per socket. The messages are immutable values: any thread.
"""

from __future__ import annotations

import array
import hashlib
import os
import pickle
import select
import socket
import struct
from typing import NamedTuple

from ...wire import events
from ...worker.loop import WorkerConfig
from ..base import Hung


def readable(fd, timeout_s: float) -> bool:
    """Whether `fd` (a descriptor or socket) is readable within `timeout_s` seconds (0: now;
    negative: as long as it takes). poll, not select: select fails past descriptor 1023, and
    a rank may hold many."""
    p = select.poll()
    p.register(fd, select.POLLIN)
    return bool(p.poll(-1 if timeout_s < 0 else int(timeout_s * 1000)))


INLINE_MAX = 64 * 1024
_RECV_MAX = INLINE_MAX + 64
_MAX_FDS = 64
_CRED = struct.Struct("3i")  # pid, uid, gid
_INLINE, _IN_MEMFD = b"I", b"M"
# A frame: MAGIC, the sender's VERSION, then _INLINE and the pickle, or _IN_MEMFD and its size
# (the memfd first among the descriptors). Version 2's frames began with _INLINE or _IN_MEMFD.
MAGIC = b"SK"
_HEAD = struct.Struct("<2sH")
_UNVERSIONED = 2  # the last version whose frames did not carry it


class VersionMismatch(Exception):
    """A frame of another version of the protocol: `theirs` (None: not a stoker frame) and
    `ours`."""

    def __init__(self, theirs: int | None, ours: int):
        self.theirs, self.ours = theirs, ours
        super().__init__(f"a node-pool frame of protocol {theirs if theirs is not None else '?'}"
                         f", this process speaks {ours}")

    def for_rank(self, job: str) -> str:
        """What a rank's user is told when its pool (the peer) speaks another version."""
        theirs = self.theirs if self.theirs is not None else "no version of it"
        return (f"stoker: the node pool speaks protocol {theirs}, this rank {self.ours}: a pool "
                f"from another stoker version is running for this job ({job}). Run every rank "
                "of a job with the same stoker; the other pool (processes named stoker-pool) "
                "exits once its last rank has gone, or give this job a name of its own "
                "(placement=stoker.Node(name=...)).")


class PeerRefused(Exception):
    """The other end is not a process of this user."""


def address(job: str) -> bytes:
    """The name of this user's pool for `job`."""
    return address_for(os.getuid(), job)


def address_for(uid: int, job: str) -> bytes:
    """`uid`'s pool for `job`, in this mount namespace: containers that share the host's
    network (and so its abstract sockets) but not its files get pools of their own."""
    try:
        mnt = os.stat("/proc/self/ns/mnt").st_ino
    except OSError:
        mnt = 0
    digest = hashlib.sha256(f"{mnt}:{job}".encode("utf-8", "replace")).hexdigest()[:20]
    return f"\0stoker-node-{uid}-{digest}".encode()


def new_socket() -> socket.socket:
    return socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)


def peer(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end, as the kernel saw it connect."""
    return _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))


def check_peer(sock: socket.socket, what: str) -> int:
    """The peer's pid; PeerRefused when it runs as another user."""
    pid, uid, _ = peer(sock)
    if uid != os.getuid():
        raise PeerRefused(f"{what} (pid {pid}) runs as uid {uid}, not as this process's uid "
                          f"{os.getuid()}")
    return pid


def send(sock: socket.socket, message, fds=()) -> None:
    """Sends `message` (picklable plain data) with `fds` (which stay the caller's)."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    extra = None
    if len(data) > INLINE_MAX:
        extra = os.memfd_create("stoker-node-message", os.MFD_CLOEXEC)
        try:
            view = memoryview(data)
            done = 0
            while done < len(data):
                done += os.pwrite(extra, view[done:], done)
        except BaseException:
            os.close(extra)
            raise
        head, fds = _HEAD.pack(MAGIC, VERSION) + _IN_MEMFD + struct.pack("<Q", len(data)), \
            [extra, *fds]
    else:
        head = _HEAD.pack(MAGIC, VERSION) + _INLINE + data
    try:
        if fds:
            sock.sendmsg([head], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                   array.array("i", fds))])
        else:
            sock.sendall(head)
    finally:
        if extra is not None:
            os.close(extra)


def recv(sock: socket.socket):
    """The next message and the descriptors that came with it (now the caller's), or None at
    the end of the connection. OSError when the connection broke."""
    data, fds, flags = _recv_fds(sock)
    if not data:
        for fd in fds:
            os.close(fd)
        return None
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        for fd in fds:
            os.close(fd)
        raise OSError("stoker: a node-pool message was truncated")
    version = frame_version(data)
    if version != VERSION:
        close_all(fds)
        raise VersionMismatch(version, VERSION)
    data = data[_HEAD.size:]
    if data[:1] == _IN_MEMFD:
        (size,) = struct.unpack("<Q", data[1:9])
        memfd, fds = fds[0], list(fds[1:])
        try:
            payload = os.pread(memfd, size, 0)
        finally:
            os.close(memfd)
        return pickle.loads(payload), fds
    return pickle.loads(data[1:]), list(fds)


def frame_version(data: bytes) -> int | None:
    """The protocol version of a frame, read from its header (None: not a stoker frame)."""
    if data[:2] == MAGIC and len(data) >= _HEAD.size:
        return _HEAD.unpack_from(data)[1]
    if data[:1] in (_INLINE, _IN_MEMFD):
        return _UNVERSIONED
    return None


def _recv_fds(sock: socket.socket) -> tuple[bytes, list, int]:
    """(data, descriptors, flags) of one message, the descriptors close-on-exec: recvmsg itself,
    since socket.recv_fds drops its flags argument (CPython gh-107898: MSG_CMSG_CLOEXEC was
    ignored, and what a rank or the pool received leaked into every program they exec)."""
    fds = array.array("i")
    data, ancillary, flags, _ = sock.recvmsg(_RECV_MAX, socket.CMSG_LEN(_MAX_FDS * fds.itemsize),
                                             socket.MSG_CMSG_CLOEXEC)
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return data, list(fds), flags


def close_all(fds) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


# -- the messages -------------------------------------------------------------------------------
# Bumped whenever a message below or the frame changes: a pool and a rank of different versions
# do not talk (every frame's header says its version; the rank is told, with both named).
# 3: the version moved from the Hello into every frame's header, and a Task carries `serial`
#    (it was a bit of `fmt`).
# 4: a Hello's config carries LoadSettings.cpus, which the pool sets for its workers
#    (budget.worker_cpus): a pool of 3 would leave a rank of 4's workers 1 CPU each, and ranks
#    of 3 and 4 would key their groups apart (their LoadSettings pickle differently) and share
#    nothing, silently.
VERSION = 4


# A rank to the pool. `w` is the rank's virtual worker, `gen` its incarnation (what the pool sends
# for an incarnation that has died since is dropped by both ends).
class Hello(NamedTuple):
    """A rank's iterator joins: the group `key`, the workers' config (the dataset, collate_fn
    and worker_init_fn come beside it, in the sealed memfd), the pool size it asks for, the
    ranks on this machine and its own rank. Answered by ``Ready`` or ``Refused``."""

    key: str
    config: WorkerConfig
    workers: int | str  # an int, or "auto"
    ranks: int
    rank: str | None
    # how many of the descriptors beside it are the sealed memfd and what it passes; the two
    # after those: the rank's standard output and error (what its workers print shows there)
    sealed_fds: int


class Task(NamedTuple):
    """Load task `task` (the rank's number) for virtual worker `w`: its index list as
    ``protocol.encode_index`` made it, seeded from (`base_seed`, `epoch`); `serial`: its
    samples load one at a time (``protocol.Task.serial``)."""

    w: int
    gen: int
    task: int
    fmt: int
    payload: bytes
    base_seed: int
    epoch: int
    serial: bool = False


class Release(NamedTuple):
    """The rank let go of batch `bid` (its last view died)."""

    bid: int


class Forget(NamedTuple):
    """Drop every task of virtual worker `w` up to incarnation `gen` (the rank re-issues them,
    or no longer wants them)."""

    w: int
    gen: int


class Kill(NamedTuple):
    """The rank's hang watch gave up on virtual worker `w`: kill the pool worker loading its
    task, named with `hung` (``base.Hung``)."""

    w: int
    gen: int
    hung: Hung


# The pool to a rank.
class Ready(NamedTuple):
    """The answer to ``Hello``: the pool's pid, its job, the most pool workers that may load
    at once (the node's bound), this group's worker pids and how many ranks it serves."""

    pid: int
    job: str
    workers: int
    pids: tuple
    clients: int


class Refused(NamedTuple):
    """The pool cannot take this rank's loader: why, in words for the user."""

    reason: str


class Pids(NamedTuple):
    """The pool workers of the rank's group now (sent when one starts or ends): what
    ``stats()["pool"]["pids"]`` names."""

    pids: tuple


class Began(NamedTuple):
    """A pool worker past its start-up (process `pid`) took task `task` of `w`."""

    w: int
    gen: int
    task: int
    pid: int


class Batch(NamedTuple):
    """Task `task`'s batch: batch `bid` of the pool, `nbytes` at `offset` of the slot's memfd
    (which comes beside the message), loaded by pool worker process `pid`."""

    w: int
    gen: int
    task: int
    bid: int
    offset: int
    nbytes: int
    pid: int


class Event(NamedTuple):
    """Any other event of `w`'s task (``wire.events``: skips, an error, a stream's state)."""

    w: int
    gen: int
    event: events.Event


class Died(NamedTuple):
    """Virtual worker `w` died with a pool worker (or the pool could not load its task):
    ``events.WorkerExited``, named as a local death is. The pool has forgotten the rest of
    that incarnation's tasks."""

    w: int
    gen: int
    exited: events.WorkerExited

