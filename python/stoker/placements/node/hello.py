"""What a rank sends the pool to join it (``wire.Hello``): the group's key, the workers' config
without the dataset, and the sealed memfd holding the dataset, ``collate_fn`` and
``worker_init_fn`` (the same memfd spawn and forkserver workers start from).

The key is what decides which ranks share workers: the pickled bytes (and what is passed beside
them: a memfd by its contents, a file by which file it is) and the options that change a batch. Ranks whose loaders are
the same get one group; any other difference (a shard list, a path) gives another.

Pure functions, run by the thread that starts the iterator's workers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import mmap
import multiprocessing.spawn
import os
import pickle

from ...common import system as _system
from ...common.errors import EngineError
from ...wire.sealed import PerWorker, Sealed
from . import wire


def group_key(config, sealed: Sealed) -> tuple[str, bool]:
    """The group's key, and whether the pickle refers to this process's ``__main__`` (its
    script's classes)."""
    h = hashlib.sha256()
    if sealed.fd is None:
        raise ValueError("stoker: the dataset's memfd was closed before it was sent")
    with mmap.mmap(sealed.fd, sealed.nbytes, prot=mmap.PROT_READ) as m:
        h.update(m)
        uses_main = m.find(b"__main__") >= 0
    for fd in sealed.extra_fds:
        _hash_passed(h, fd)
    h.update(pickle.dumps(keyed_settings(config)))
    return h.hexdigest(), uses_main


# The fields of a WorkerConfig that stay out of the group's key, each with why: every other
# field changes what or how a worker loads, and ranks that differ in it get groups of their own
# (a new field is in the key unless it is named here: nothing is dropped silently).
NOT_KEYED = {
    "dataset": "in the sealed pickle, hashed byte for byte",
    "collate_fn": "in the sealed pickle",
    "init_fn": "in the sealed pickle",
    "num_workers": "the pool sizes its workers itself (stoker.Node(workers=...))",
    "base_seed": "drawn anew each epoch by each rank; the pool seeds per sample",
    "seeder": "the pool seeds per sample (Options forces seed=\"per_sample\" under a Node)",
    "shared_memory_share": "a rank's own cap: not sent to the pool (make() clears it)",
    "stream_states": "a rank's resumed state: not sent to the pool (make() clears it)",
    "prepare": "spawn's preparation data, made here by make(), not a loader setting",
    "stdio": "each rank's own output streams, passed beside the hello",
}


def keyed_settings(config) -> tuple:
    """The settings of `config` that go into the group's key: (name, value) of every field
    not in NOT_KEYED, in declaration order."""
    return tuple((f.name, getattr(config, f.name)) for f in dataclasses.fields(config)
                 if f.name not in NOT_KEYED)


def _hash_passed(h, fd: int) -> None:
    """What a descriptor passed beside the pickle adds to the key: a memfd (a SharedList's: each
    rank makes its own, with the same items) by its contents, a file (an np.memmap's) by which
    file it is."""
    try:
        memfd = os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:")
    except OSError:
        memfd = False
    st = os.fstat(fd)
    if not memfd or st.st_size == 0:
        h.update(f"{st.st_dev}:{st.st_ino}:{st.st_size}".encode())
        return
    with mmap.mmap(fd, st.st_size, prot=mmap.PROT_READ) as m:
        h.update(b"memfd")
        h.update(m)


def preparation(uses_main: bool) -> dict:
    """What spawn would tell a child of this process (its sys.path, directory, start method),
    less its secret (the pool's workers are not this process's children) and, unless the
    dataset's pickle needs a class of this process's script, less the script: a pool worker
    runs a script's top level only when it must, as spawn's workers always do (one forked from
    the template, a copy of a rank of the same script, already has it: multiprocessing then
    leaves it as it is)."""
    data = multiprocessing.spawn.get_preparation_data("stoker-node-worker")
    data.pop("authkey", None)
    if not uses_main:
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
    return data


def make(config, workers) -> tuple[wire.Hello, Sealed]:
    """The hello for `config`'s loader and the sealed memfd that goes beside it (the caller
    closes it once sent), then this process's standard output and error (``fds``)."""
    try:
        sealed = Sealed((config.dataset, config.collate_fn, config.init_fn))
    except PerWorker as e:
        raise EngineError(f"stoker: placement=stoker.Node() needs the dataset pickled once "
                          f"for the node's pool, and it holds {e}") from None
    try:
        key, uses_main = group_key(config, sealed)
        plain = dataclasses.replace(
            config, dataset=None, collate_fn=None, init_fn=None, stream_states={},
            shared_memory_share=None, prepare=preparation(uses_main))
        return wire.Hello(key, plain, workers, _system.local_ranks(),
                          os.environ.get("RANK"), len(sealed.fds())), sealed
    except BaseException:
        sealed.close()
        raise
