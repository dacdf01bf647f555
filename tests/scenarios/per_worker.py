"""Handles opened in each worker (``stoker.per_worker``): an sqlite3 connection (``Rows``, for
tests/pickling/test_by_value.py, here so that a spawned worker imports it without the tests' conftest),
and a real fork-unsafe library: a Lance dataset (pylance: a Rust runtime with its own threads)
opened and read in the main process, then read from forked workers (prints one JSON line)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys

import torch

import stoker

ROWS = 64


class Rows(torch.utils.data.Dataset):
    """Row i of an sqlite3 table, through a connection each process opens for itself: (value,
    the pid that opened the connection, the pid that loaded the row). `kill_at`: SIGKILLs its
    worker there once (`marks`: the file that says it did)."""

    def __init__(self, path: str, n: int = 32, kill_at=None, marks=None):
        self.path, self.n, self.kill_at, self.marks = path, n, kill_at, marks

    @stoker.per_worker
    def db(self):
        return os.getpid(), sqlite3.connect(self.path, check_same_thread=False)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.kill_at and not os.path.exists(self.marks):
            open(self.marks, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        opener, conn = self.db
        (value,) = conn.execute("select v from t where k = ?", (i,)).fetchone()
        return torch.tensor([value, opener, os.getpid()])


class LanceRows(torch.utils.data.Dataset):
    """Row i of a Lance dataset: (its value, the pid that opened the handle it came through)."""

    def __init__(self, uri: str):
        self.uri = uri

    @stoker.per_worker
    def table(self):
        import lance

        return os.getpid(), lance.dataset(self.uri)

    def __len__(self):
        return ROWS

    def __getitem__(self, i):
        opener, table = self.table
        row = table.take([i], columns=["v"]).to_pylist()[0]
        return torch.tensor([row["v"], opener, os.getpid()])


def write(uri: str) -> None:
    import lance
    import pyarrow as pa

    lance.write_dataset(pa.table({"v": [i * 7 for i in range(ROWS)]}), uri)


def read_under_fork(uri: str, context: str = "fork") -> None:
    write(uri)
    ds = LanceRows(uri)
    # the main process uses the dataset first: its runtime's threads run here at the fork
    first = ds[3].tolist()
    dl = stoker.DataLoader(ds, batch_size=8, num_workers=2, multiprocessing_context=context)
    rows = torch.cat(list(dl)).tolist()
    again = ds[5].tolist()  # the main process's handle still works, and is still its own
    json.dump({"main": os.getpid(), "first": first, "again": again, "rows": rows}, sys.stdout)
    print()
