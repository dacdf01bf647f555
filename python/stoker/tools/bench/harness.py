"""Runs one loader on one workload in a fresh process and measures what the user pays.

Per run: samples/s (after the first batch), time to the first batch, main-process CPU seconds
per batch, total PSS of the main process and its workers (psutil, read at the last batch),
read/write system calls per batch (main and workers, /proc/PID/io) and batch bytes. The consumer
copies every tensor of every batch into a preallocated buffer, as a host-to-device copy would
read it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def _tensors(obj, out):
    import torch

    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _tensors(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _tensors(v, out)
    return out


class Consumer:
    """Copies each tensor into a buffer kept per position (grown when a batch is larger)."""

    def __init__(self):
        self.buffers = {}
        self.bytes = 0

    def __call__(self, batch) -> int:
        n = 0
        for k, t in enumerate(_tensors(batch, [])):
            buf = self.buffers.get(k)
            if buf is None or buf.numel() < t.numel() or buf.dtype != t.dtype:
                buf = self.buffers[k] = t.new_empty(t.numel())
            buf[: t.numel()].copy_(t.reshape(-1))
            n += t.numel() * t.element_size()
        self.bytes += n
        return n


def _io_syscalls(pids) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/io") as f:
                for line in f:
                    if line.startswith(("syscr:", "syscw:")):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total


def total_pss(proc) -> int:
    """PSS of `proc` and all its descendants, in bytes (what they cost the machine together)."""
    total = 0
    for p in [proc] + proc.children(recursive=True):
        try:
            total += p.memory_full_info().pss
        except Exception:
            pass
    return total


RAY_ADDRESS_ENV = "STOKER_BENCH_RAY_ADDRESS"  # the cluster 'stoker-ray' runs on


def make_loader(who, dataset, workload, workers, start_method=None, threads=None):
    """`threads`: stoker's threads_per_worker (None: its default)."""
    import torch

    kwargs = dict(batch_size=workload.batch_size, num_workers=workers, shuffle=True,
                  generator=torch.Generator().manual_seed(0))
    if threads is not None and who == "stoker":
        kwargs["threads_per_worker"] = threads
    if start_method and workers > 0 and who in ("torch", "stoker"):
        kwargs["multiprocessing_context"] = start_method
    if workload.collate_fn is not None:
        kwargs["collate_fn"] = workload.collate_fn
    if who == "stoker":
        import stoker

        return stoker.DataLoader(dataset, **kwargs)
    if who == "stoker-ray":  # the workers as Ray actors (their PSS is not in this process's)
        import stoker

        return stoker.DataLoader(dataset, placement=stoker.Ray(
            address=os.environ.get(RAY_ADDRESS_ENV)), **kwargs)
    if who == "torch":
        return torch.utils.data.DataLoader(dataset, **kwargs)
    from . import peers

    return peers.make(who, dataset, kwargs)


def run_in_process(who: str, workload_name: str, workers: int, start_method=None,
                   threads=None) -> dict:
    import gc

    import psutil
    import torch

    from .workloads import WORKLOADS

    # One thread for the consumer's copies, as one thread drives host-to-device copies: intra-op
    # threads would otherwise spin between batches and steal the workers' cores.
    torch.set_num_threads(1)
    wl = WORKLOADS[workload_name]
    workers = wl.workers if (wl.workers and workers != 0) else workers
    me = psutil.Process()
    dataset = wl.make(who)
    gc.collect()
    try:  # freed heap pages would otherwise count, at random, in whatever is measured next
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass
    base_pss = me.memory_full_info().pss
    loader = make_loader(who, dataset, wl, workers, start_method, threads)
    consume = Consumer()
    t0 = time.perf_counter()
    it = iter(loader)
    first = next(it)
    ttfb = time.perf_counter() - t0
    consume(first)
    del first
    pids = [me.pid] + [c.pid for c in me.children(recursive=True)]
    sys0 = _io_syscalls(pids)
    cpu0 = time.process_time()
    t1 = time.perf_counter()
    batches, samples, pss, sys_mid, at_once = 0, 0, 0, 0, None
    # Reading /proc for the counters costs the main process 10-20 ms per process (smaps): that
    # time is taken out of the timed window (wall and CPU), as it is no loader's.
    measuring_s = measuring_cpu = 0.0
    expected = max(1, wl.samples // wl.batch_size - 1)
    middle = max(1, expected // 2)
    for batch in it:
        n = consume(batch)
        del batch
        batches += 1
        samples += wl.batch_size
        reading = who == "stoker" and middle <= batches < middle + AT_ONCE_READS
        if batches in (middle, expected) or reading:
            # thread_time: the reads' own CPU (a peer's threads in this process keep working)
            m0, mc0 = time.perf_counter(), time.thread_time()
            if batches == middle:
                pids = [me.pid] + [c.pid for c in me.children(recursive=True)]
                sys_mid = _io_syscalls(pids)
            if reading:
                now = _at_once(loader)
                at_once = now if at_once is None else max(at_once, now or 0)
            if batches == expected:  # the last batch: every worker has touched what it will
                pss = total_pss(me)
            measuring_s += time.perf_counter() - m0
            measuring_cpu += time.thread_time() - mc0
    elapsed = time.perf_counter() - t1 - measuring_s
    cpu = time.process_time() - cpu0 - measuring_cpu
    del it, loader
    return {
        "loader": who,
        "workload": workload_name,
        "workers": workers,
        "samples_per_s": samples / elapsed if elapsed > 0 else 0.0,
        "time_to_first_batch_s": ttfb,
        "main_cpu_ms_per_batch": 1e3 * cpu / max(1, batches),
        "pss_total_mb": pss / 2**20,
        # replaced by a num_workers=0 run's PSS where the workload measures memory
        "pss_single_process_mb": base_pss / 2**20,
        "syscalls_per_batch": (sys_mid - sys0) / max(1, expected // 2) if batches else None,
        "batch_bytes": n if batches else 0,
        "batches": batches,
        "at_once": at_once,
        "gil_enabled": getattr(sys, "_is_gil_enabled", lambda: True)(),
    }


# ``at_once`` is the most of this many reads, one per batch from mid-run: one read alone may
# fall while the worker encodes a batch (none loading then, for that instant).
AT_ONCE_READS = 10


def _at_once(loader):
    """The most samples one of a stoker loader's workers loads at once now (mid-run: what
    "auto" reached), from ``stats()``; None where it does not say (no worker process)."""
    try:
        workers = loader.stats().get("workers") or []
    except Exception:
        return None
    counts = [int(w["in_flight"]) for w in workers if w.get("in_flight") is not None]
    return max(counts) if counts else None


def run_with_memory_baseline(who: str, workload: str, workers: int) -> dict:
    """A run, plus the same loader with num_workers=0 (one process doing all the work), whose
    PSS is the baseline the workers' total is compared with."""
    res = run(who, workload, workers)
    single = run(who, workload, 0)
    if "error" not in res and "error" not in single:
        res["pss_single_process_mb"] = single["pss_total_mb"]
    return res


def in_fresh_interpreter(module: str, func: str, args: tuple, timeout: float = 300):
    """Calls ``stoker.tools.bench.<module>.<func>(*args)`` in a fresh interpreter, so runs cannot
    disturb each other: (its result, through JSON, or None when it printed none; its stderr).
    ``subprocess.TimeoutExpired`` past `timeout`."""
    code = (f"import json; from stoker.tools.bench.{module} import {func}; "
            f"print('RESULT', json.dumps({func}(*{args!r})))")
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=timeout, env=env)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):]), p.stderr
    return None, p.stderr


def bound(workload: str, timeout: float = 300) -> dict:
    """The workload's bound (``bound.py``), in a fresh interpreter like every run: for a workload
    whose dataset takes another form for stoker (``Workload.forms``), the quickest form's."""
    from .workloads import WORKLOADS

    best = None
    for who in WORKLOADS[workload].forms:
        try:
            res, stderr = in_fresh_interpreter("bound", "measure", (workload, who), timeout)
        except subprocess.TimeoutExpired:
            res, stderr = None, f"timed out after {timeout} s"
        if res is None:
            return {"loader": "bound", "workload": workload,
                    "error": (stderr.strip().splitlines() or ["no output"])[-1]}
        if best is None or res["bound_samples_per_s"] > best["bound_samples_per_s"]:
            best = res
    assert best is not None
    best["loader"] = "bound"
    return best


def run(who: str, workload: str, workers: int, timeout: float = 300,
        start_method=None, threads=None) -> dict:
    """One measured run in a fresh interpreter."""
    try:
        res, stderr = in_fresh_interpreter(
            "harness", "run_in_process", (who, workload, workers, start_method, threads),
            timeout)
    except subprocess.TimeoutExpired:
        return {"loader": who, "workload": workload, "error": f"timed out after {timeout} s"}
    if res is not None:
        return res
    err = (stderr.strip().splitlines() or ["no output"])[-1]
    return {"loader": who, "workload": workload, "error": err}
