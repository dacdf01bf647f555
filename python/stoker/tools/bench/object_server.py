"""An HTTP object store on loopback for the ``remote`` workload (and the tests): each
``GET /obj/N`` is answered after a fixed latency with N's object, ``size`` bytes that are a
function of N (so a loader's values can be checked), over keep-alive HTTP/1.1.

    python -m stoker.tools.bench.object_server --latency-ms 20 --size 65536   # prints "PORT 43121"

One asyncio event loop in its own process: a request's latency is a timer, not a thread, so
hundreds of requests wait at once without the server becoming the bottleneck. Listens on
127.0.0.1 only; it ends when its standard input closes (the process that started it ended) or on
SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys

import numpy as np


def object_bytes(n: int, size: int) -> bytes:
    """Object `n`: `size` bytes, (n + k) mod 251 for k = 0, 1, ..."""
    return ((np.arange(size, dtype=np.int64) + n) % 251).astype(np.uint8).tobytes()


async def _serve(port: int, latency_s: float, size: int, ready) -> None:
    cache: dict[int, bytes] = {}

    async def handle(reader, writer):
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass  # headers: nothing in them changes the answer
                parts = line.split()
                path = parts[1].decode() if len(parts) > 1 else ""
                await asyncio.sleep(latency_s)
                if path.startswith("/obj/") and path[5:].isdigit():
                    n = int(path[5:])
                    body = cache.get(n)
                    if body is None:
                        body = cache[n] = object_bytes(n, size)
                    head = b"HTTP/1.1 200 OK\r\n"
                else:
                    body, head = b"not found", b"HTTP/1.1 404 Not Found\r\n"
                writer.write(head + b"Content-Type: application/octet-stream\r\n"
                             b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # (cancelled: the server ends with the connection still open)
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=1024)
    ready(server.sockets[0].getsockname()[1])
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.add_signal_handler(signal.SIGTERM, lambda: done.done() or done.set_result(None))
    # the starter's end closes our stdin: then this server ends too (no orphan)
    loop.add_reader(sys.stdin.fileno(), lambda: done.done() or done.set_result(None))
    async with server:
        await done


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stoker.tools.bench.object_server")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--size", type=int, default=64 * 1024)
    args = ap.parse_args(argv)
    asyncio.run(_serve(args.port, args.latency_ms / 1e3, args.size,
                       lambda port: print(f"PORT {port}", flush=True)))
    return 0


class ObjectServer:
    """Starts the server in its own process: ``with ObjectServer(20) as srv: srv.url``."""

    def __init__(self, latency_ms: float = 20.0, size: int = 64 * 1024):
        self.latency_ms, self.size = latency_ms, size
        self.proc = None
        self.url = ""

    def __enter__(self):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "stoker.tools.bench.object_server", "--latency-ms",
             str(self.latency_ms), "--size", str(self.size)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=dict(os.environ, PYTHONWARNINGS="ignore"))
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            self.proc.kill()
            raise RuntimeError(f"the object server did not start: {line!r}")
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"
        return self

    def __exit__(self, *exc):
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


if __name__ == "__main__":
    sys.exit(main())
