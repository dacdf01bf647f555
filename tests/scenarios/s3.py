"""A real S3 API (moto's server on loopback, in its own process) read by boto3 from worker
threads: one client per worker process, shared by its threads (boto3's clients are thread-safe;
its sessions and resources are not)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import torch

import stoker
from scenarios.probes import leftovers

BUCKET = "stoker-test"
N, SIZE = 96, 8192
ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
       "AWS_DEFAULT_REGION": "us-east-1"}


def _body(i: int) -> bytes:
    return ((np.arange(SIZE, dtype=np.int64) * 7 + i) % 256).astype(np.uint8).tobytes()


class S3Objects(torch.utils.data.Dataset):
    """Object `i` of the bucket; `missing` names keys that were never put."""

    def __init__(self, endpoint: str, missing=()):
        self.endpoint = endpoint
        self.missing = set(missing)
        self._client = None
        self._pid = None
        self._lock = threading.Lock()

    def __getstate__(self):
        return {"endpoint": self.endpoint, "missing": self.missing}

    def __setstate__(self, d):
        self.__init__(d["endpoint"], d["missing"])

    def __len__(self):
        return N

    def client(self):
        with self._lock:  # the first threads of a worker make one client, not one each
            if self._pid != os.getpid():
                import boto3

                self._client = boto3.session.Session().client(
                    "s3", endpoint_url=self.endpoint, region_name="us-east-1")
                self._pid = os.getpid()
            return self._client

    def __getitem__(self, i):
        key = f"missing/{i}" if i in self.missing else f"obj/{i}"
        body = self.client().get_object(Bucket=BUCKET, Key=key)["Body"].read()
        return torch.frombuffer(bytearray(body), dtype=torch.uint8), i


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, **ENV))
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, endpoint
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("moto's server did not start")


def read_from_worker_threads():
    os.environ.update(ENV)
    import boto3

    proc, endpoint = _start_server()
    try:
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        for i in range(N):
            s3.put_object(Bucket=BUCKET, Key=f"obj/{i}", Body=_body(i))
        dl = stoker.DataLoader(S3Objects(endpoint), batch_size=16, num_workers=2,
                               threads_per_worker=8, shuffle=True,
                               generator=torch.Generator().manual_seed(0))
        for _ in range(2):  # two epochs: new workers, new clients
            seen = []
            for data, idx in dl:
                for row, i in zip(data, idx.tolist()):
                    assert row.numpy().tobytes() == _body(i), f"object {i}'s bytes differ"
                    seen.append(i)
            assert sorted(seen) == list(range(N)), sorted(seen)
        # a key that is not there: named with its index, skipped under on_error="skip"
        dl = stoker.DataLoader(S3Objects(endpoint, missing=[37]), batch_size=16, num_workers=2,
                               threads_per_worker=8, on_error="skip")
        seen = [i for _, idx in dl for i in idx.tolist()]
        assert sorted(seen) == [i for i in range(N) if i != 37], seen
        assert [s.index for s in dl.skipped] == [37] and "NoSuchKey" in dl.skipped[0].reason
        # a worker killed with a batch of requests in flight: nothing lost, nothing twice
        dl = stoker.DataLoader(S3Objects(endpoint), batch_size=16, num_workers=2,
                               threads_per_worker=8)
        it = iter(dl)
        seen = next(it)[1].tolist()
        os.kill(it._workers[1].pid, signal.SIGKILL)
        seen += [i for _, idx in it for i in idx.tolist()]
        assert sorted(seen) == list(range(N)), sorted(seen)
        del it
    finally:
        proc.terminate()
        proc.wait(30)
    assert not leftovers(), leftovers()
