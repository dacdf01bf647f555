"""``stoker bench --workloads remote``: samples on an object store that answers each request after
a latency (``object_server.py``, on loopback, in its own process), as data on S3, GCS or an HTTP
store is read. Each sample is one 64 KiB object fetched with urllib3 (what boto3 uses) in
``__getitem__``, or with an ``async def __getitem__`` on asyncio streams.

Rows: torch with 2, 8 and 32 workers (a torch worker loads one sample at a time, so only more
processes hide the latency); stoker with 2 workers and ``threads_per_worker`` 32 and "auto"; stoker
with the async dataset, with no setting (an async dataset's default: "auto") and with 32. Each run is a fresh interpreter: samples/s after the first batch, the
first batch, total PSS of the main process and its workers, and their number. Values are
checked: every sample's bytes are its object's.
"""

from __future__ import annotations

import asyncio
import os
import time

import torch
from torch.utils.data import Dataset

from . import harness
from .object_server import ObjectServer, object_bytes

BATCH = 32
SIZE = 64 * 1024

# (label, loader, num_workers, threads_per_worker or None, async dataset)
ROWS = (
    ("torch, 2 workers", "torch", 2, None, False),
    ("torch, 8 workers", "torch", 8, None, False),
    ("torch, 32 workers", "torch", 32, None, False),
    ("stoker, 2 workers x 32 threads", "stoker", 2, 32, False),
    ("stoker, 2 workers, threads auto", "stoker", 2, "auto", False),
    ("stoker, 2 workers, async (no setting)", "stoker", 2, None, True),
    ("stoker, 2 workers, async x 32", "stoker", 2, 32, True),
)


class _Objects(Dataset):
    """`n` objects of the store at `url`; pickles without its connections (each process makes
    its own)."""

    def __init__(self, url: str, n: int):
        self.url, self.n = url, n

    def __getstate__(self):
        return {"url": self.url, "n": self.n}

    def __setstate__(self, d):
        self.__init__(d["url"], d["n"])

    def __len__(self):
        return self.n


class RemoteObjects(_Objects):
    """Object i of the store at `url`, fetched with one urllib3 pool per process (shared by its
    threads, as urllib3 allows), as a uint8 tensor, and i."""

    def __init__(self, url: str, n: int):
        super().__init__(url, n)
        self._pool = None
        self._pid = None

    def _http(self):
        if self._pid != os.getpid():  # a pool is never used across fork
            import urllib3

            self._pool = urllib3.PoolManager(maxsize=64, retries=urllib3.Retry(3))
            self._pid = os.getpid()
        return self._pool

    def __getitem__(self, i):
        r = self._http().request("GET", f"{self.url}/obj/{i}")
        if r.status != 200:
            raise OSError(f"GET /obj/{i}: HTTP {r.status}")
        return torch.frombuffer(bytearray(r.data), dtype=torch.uint8), i


class AsyncRemoteObjects(_Objects):
    """The same objects through ``async def __getitem__``: keep-alive HTTP/1.1 on asyncio streams,
    a few connections per event loop."""

    def __init__(self, url: str, n: int):
        super().__init__(url, n)
        host, _, port = url.removeprefix("http://").partition(":")
        self._host, self._port = host, int(port)
        self._idle: dict = {}  # event loop -> its idle connections

    async def __getitem__(self, i):
        idle = self._idle.setdefault(id(asyncio.get_running_loop()), [])
        reader, writer = idle.pop() if idle else await asyncio.open_connection(self._host,
                                                                               self._port)
        try:
            writer.write(f"GET /obj/{i} HTTP/1.1\r\nHost: {self._host}\r\n\r\n".encode())
            status = await reader.readline()
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                if name.lower() == b"content-length":
                    length = int(value)
            body = await reader.readexactly(length)
        except BaseException:
            writer.close()
            raise
        idle.append((reader, writer))
        if b" 200 " not in status:
            raise OSError(f"GET /obj/{i}: {status.decode().strip()}")
        return torch.frombuffer(bytearray(body), dtype=torch.uint8), i


def run_in_process(url: str, who: str, workers: int, threads, is_async: bool,
                   samples: int) -> dict:
    import psutil

    import stoker

    torch.set_num_threads(1)
    ds = (AsyncRemoteObjects if is_async else RemoteObjects)(url, samples)
    kwargs = dict(batch_size=BATCH, num_workers=workers, shuffle=True,
                  generator=torch.Generator().manual_seed(0))
    if who == "torch":
        loader = torch.utils.data.DataLoader(ds, **kwargs)
    else:
        loader = stoker.DataLoader(ds, threads_per_worker=threads, **kwargs)
    me = psutil.Process()
    t0 = time.perf_counter()
    it = iter(loader)
    first = next(it)
    ttfb = time.perf_counter() - t0
    seen = list(first[1].tolist())
    _check(first)
    t1 = time.perf_counter()
    n, pss, procs = 0, 0, 0
    for k, batch in enumerate(it):
        _check(batch)
        seen += batch[1].tolist()
        n += len(batch[1])
        if k == samples // BATCH // 2:  # mid-run: every worker is up and loading
            m0 = time.perf_counter()
            pss = harness.total_pss(me)
            procs = 1 + len(me.children(recursive=True))
            t1 += time.perf_counter() - m0  # (reading smaps is no loader's time)
    elapsed = time.perf_counter() - t1
    if sorted(seen) != list(range(samples)):
        raise AssertionError("samples lost or repeated")
    del it, loader
    return {"samples_per_s": n / elapsed, "time_to_first_batch_s": ttfb,
            "pss_total_mb": pss / 2**20, "processes": procs}


def _check(batch) -> None:
    data, idx = batch
    k = int(idx[0])
    if data[0].numpy().tobytes() != object_bytes(k, SIZE):
        raise AssertionError(f"object {k}'s bytes differ")


def main(latency_ms: float = 20.0, rounds: int = 1, samples: int = 4096,
         rows=ROWS) -> dict:
    results = []
    with ObjectServer(latency_ms, SIZE) as srv:
        for r in range(rounds):
            for label, who, workers, threads, is_async in rows:
                # torch with 2 workers loads ~90 samples/s here: fewer samples keep it short
                n = min(samples, 384) if (who == "torch" and workers <= 2) else samples
                try:
                    res, stderr = harness.in_fresh_interpreter(
                        "remote", "run_in_process", (srv.url, who, workers, threads, is_async,
                                                     n), timeout=600)
                except Exception as e:  # a row that fails is named, the others still run
                    res, stderr = None, f"{type(e).__name__}: {e}"
                row = {"row": label, "loader": who, "workers": workers, "threads": threads,
                       "async": is_async, "round": r}
                if res is None:
                    row["error"] = (stderr.strip().splitlines() or ["no output"])[-1]
                else:
                    row.update(res)
                results.append(row)
    summary = _summarize(results)
    _print(summary, latency_ms)
    return {"latency_ms": latency_ms, "runs": results, "summary": summary}


def _summarize(results) -> list:
    import statistics

    out = []
    for label, *_ in ROWS:
        rs = [r for r in results if r["row"] == label and "error" not in r]
        errs = [r["error"] for r in results if r["row"] == label and "error" in r]
        if not rs:
            if errs:
                out.append({"row": label, "error": errs[0]})
            continue
        row = {"row": label}
        for key in ("samples_per_s", "time_to_first_batch_s", "pss_total_mb", "processes"):
            row[key] = statistics.median(r[key] for r in rs)
        out.append(row)
    by = {r["row"]: r for r in out if "error" not in r}
    ref32, ref2 = by.get("torch, 32 workers"), by.get("torch, 2 workers")
    for r in out:
        if "error" in r:
            continue
        if ref32:
            r["x_torch32_speed"] = r["samples_per_s"] / ref32["samples_per_s"]
            r["x_torch32_pss"] = r["pss_total_mb"] / ref32["pss_total_mb"]
        if ref2:
            r["x_torch2_speed"] = r["samples_per_s"] / ref2["samples_per_s"]
    return out


def _print(summary, latency_ms) -> None:
    print(f"\nremote: 64 KiB objects over HTTP on loopback, {latency_ms:g} ms per request, "
          f"batch {BATCH}")
    print(f"{'loader':<34} {'samples/s':>9} {'x torch32':>9} {'x torch2':>8} {'PSS MB':>7} "
          f"{'x PSS32':>7} {'procs':>5} {'1st batch s':>11}")
    for r in summary:
        if "error" in r:
            print(f"{r['row']:<34} ERROR: {r['error']}")
            continue
        print(f"{r['row']:<34} {r['samples_per_s']:>9.0f} {r.get('x_torch32_speed', 0):>9.2f} "
              f"{r.get('x_torch2_speed', 0):>8.1f} {r['pss_total_mb']:>7.0f} "
              f"{r.get('x_torch32_pss', 0):>7.2f} {r['processes']:>5.0f} "
              f"{r['time_to_first_batch_s']:>11.2f}")
