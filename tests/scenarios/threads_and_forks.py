"""Threads and forks that are not workers (tests/loader/iterators/test_threads_and_forks.py): a child forked
from the main process frees nothing the main process uses and keeps none of the loader's slots or
descriptors; workers started from a thread outlive that thread."""

from __future__ import annotations

import gc
import os
import tempfile
import threading
import weakref

import stoker
from scenario_datasets import KillsOnceAt, Squares
from scenarios.probes import alive


class Cycle:
    """An object made to refer to itself: garbage that only the cycle collector frees."""


def _slot_maps() -> list[str]:
    """This process's mappings of worker slots."""
    return [line for line in open("/proc/self/maps") if "stoker-w" in line and "-slot" in line]


def _report(tag: str, sockets: set[str]) -> str:
    """`tag`, how many slots this process maps and which engine descriptors it holds (its channel
    end among `sockets`, pidfds, status pages, stderr and crash files)."""
    fds = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    engine = sorted(t for t in fds if t in sockets or "pidfd" in t or "stoker-status" in t
                    or "stoker-stderr" in t or "stoker-crash" in t)
    return f"{tag} slots={len(_slot_maps())} engine_fds={engine}"


def forked_child_frees_nothing(garbage: bool):
    """A child forked while a batch is held (`garbage`: held only by cyclic garbage) reports what
    it maps and holds before and after dropping it; the parent's batches all stay intact."""
    n = 400
    # 64 KiB samples: batches stay zero-copy views of their slot (small ones would be copied)
    loader = stoker.DataLoader(Squares(n, shape=(16, 1024)), batch_size=4, num_workers=1,
                               prefetch_factor=2, multiprocessing_context="fork")
    it = iter(loader)
    gc.disable()            # the parent collects nothing until the end: garbage keeps its lease
    held = next(it)
    first = held[1].tolist()
    ref = weakref.ref(held[0])
    if garbage:
        h = Cycle()
        h.me = h
        h.batch = held
        del h, held
    mine = {os.readlink(f"/proc/self/fd/{fd}") for fd in it.workers.owned_fds()}
    sockets = {t for t in mine if t.startswith("socket:")}
    assert len(sockets) == 1, mine

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        lines = [_report("before", sockets)]
        if not garbage:
            del held
        # (with `garbage` the batch is cyclic garbage: gc.collect() frees it)
        gc.collect()
        lines.append(_report("after", sockets))
        os.write(w, ("\n".join(lines) + "\n").encode())
        os._exit(0)
    os.close(w)
    child = b""
    while chunk := os.read(r, 65536):
        child += chunk
    os.waitpid(pid, 0)
    print(child.decode(), end="")

    kept = []
    seen = list(first)
    for x, y in it:           # the rest of the epoch, every batch kept (the pool grows)
        kept.append((x, y))
        seen += y.tolist()
    held_now = ref()
    assert held_now is not None
    assert held_now.flatten(1)[:, 0].tolist() == [float(i) for i in first], first
    for x, y in kept:
        assert x.flatten(1)[:, 0].tolist() == [float(i) for i in y.tolist()], y.tolist()
    assert sorted(seen) == list(range(n)), "samples lost or duplicated"


def workers_outlive_their_thread():
    """Persistent workers started by an epoch in a thread serve the next epoch in the main one."""
    loader = stoker.DataLoader(Squares(64), batch_size=4, num_workers=2, persistent_workers=True,
                               multiprocessing_context="fork")
    first = []
    t = threading.Thread(target=lambda: first.extend(y.tolist() for _, y in loader))
    t.start()
    t.join()
    assert sorted(sum(first, [])) == list(range(64))
    pids = [p.pid for p in loader._iterator._workers]
    second = []
    for x, y in loader:       # same persistent workers, iterated from the main thread
        assert x[:, 0].tolist() == [float(i) for i in y.tolist()]
        second += y.tolist()
    assert sorted(second) == list(range(64)), second
    assert [p.pid for p in loader._iterator._workers] == pids, "workers were restarted"
    assert all(alive(p) for p in pids), [alive(p) for p in pids]


def forks_gc_and_restarts_keep_every_sample():
    """Leases held by cyclic garbage, tracebacks and forked helpers, with workers restarted by
    fork and a collector that runs all the time: every sample once, every kept batch intact."""
    gc.set_threshold(5, 2, 2)
    marks = tempfile.mkdtemp()
    ds = KillsOnceAt(bad=[7, 30, 31, 90, 150], marks=marks, n=200)
    ds.shape = (16, 1024)   # 64 KiB samples: batches are zero-copy views of their slots
    loader = stoker.DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="fork")
    seen, kept = [], []
    for i, (x, y) in enumerate(loader):
        assert x.flatten(1)[:, 0].tolist() == [float(v) for v in y.tolist()], (i, y.tolist())
        seen += y.tolist()
        c = Cycle()
        c.me = c
        c.batch = (x, y)   # garbage with a lease, collected at random
        del c
        if i % 3 == 0:
            kept.append((x, y))
        try:
            raise ValueError(i)
        except ValueError as e:
            err = e  # noqa: F841  (keeps a frame, and the batch, alive through its traceback)
        if i % 10 == 0:
            pid = os.fork()
            if pid == 0:
                gc.collect()
                os._exit(0)
            os.waitpid(pid, 0)
    for x, y in kept:
        assert x.flatten(1)[:, 0].tolist() == [float(v) for v in y.tolist()], y.tolist()
    assert sorted(seen) == list(range(200)), "samples lost or duplicated"
    assert len(loader.deaths) == 5, loader.deaths


def stats_read_from_threads_while_iterating(marks: str):
    """Threads read stats(), deaths, skipped and `stoker top`'s snapshot all the while the main
    thread iterates a loader whose workers load with threads and one of which is killed: every
    read is a whole report, and every sample arrives once."""
    import json

    from stoker.tools import top

    loader = stoker.DataLoader(KillsOnceAt([37], marks, n=160), batch_size=4, num_workers=2,
                               threads_per_worker=3)
    done, reads, errors = threading.Event(), [0] * 4, []

    def read(n):
        try:
            while True:  # (at least once, however late this thread runs)
                s = stoker.stats(loader) if n % 2 else loader.stats()
                json.dumps(s)  # (a report a thread got whole is JSON-able)
                assert all(isinstance(w["id"], int) for w in s["workers"]), s
                assert isinstance(stoker.deaths(loader), list)
                assert isinstance(stoker.skipped(loader), list)
                if n == 0:
                    assert isinstance(top.snapshot(), list)
                reads[n] += 1
                if done.is_set():
                    return
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=read, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    try:
        got = sorted(int(x) for b in loader for x in b[1])
    finally:
        done.set()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    assert got == list(range(160)), got
    assert len(loader.deaths) == 1 and all(r > 0 for r in reads), (loader.deaths, reads)
    assert len(loader.stats()["deaths"]) == 1
