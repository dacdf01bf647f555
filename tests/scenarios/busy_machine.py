"""Scenarios of tests/loader/iterators/test_busy_machine.py: a worker that computes, on a machine
whose CPUs the scenario keeps busy (support/burner.py: its burners in its own session, where its
loader runs), each in a fresh interpreter (logging set up from the start)."""

from __future__ import annotations

import json
import logging
import os
import time

import torch

import stoker
from support.burner import cpus_taken


class Spins:
    """`ms` of CPU per sample (pure Python: a decoder written in Python), no wait."""

    def __init__(self, n: int, ms: float):
        self.n, self.ms = n, ms

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        end = time.thread_time() + self.ms / 1e3  # CPU time: the same work however busy
        while time.thread_time() < end:
            pass
        return torch.tensor([i])


def cpu_bound_worker(batches: int = 40, batch_size: int = 8, ms: float = 4.0, per_cpu: int = 6):
    """One worker, threads_per_worker="auto", a dataset that computes, and `per_cpu` burners to
    a CPU from before the loader starts until its epoch ends: prints, as JSON, how many samples
    its status page said load at once as each batch arrived (the width "auto" gives it), stoker
    doctor's "waiting or computing" check taken at the last batch and the CPUs its worker was
    given (``LoadSettings.cpus``); the stall notice goes to stderr."""
    logging.basicConfig(format="%(message)s")
    with cpus_taken(per_cpu):
        in_flight, check, cpus = _cpu_bound_epoch(batches, batch_size, ms)
    print("RESULT " + json.dumps({"in_flight": in_flight, "doctor": check, "cpus": cpus}),
          flush=True)


def _cpu_bound_epoch(batches, batch_size, ms):
    from stoker.tools import doctor, top

    loader = stoker.DataLoader(Spins(batches * batch_size, ms), batch_size=batch_size,
                               num_workers=1, threads_per_worker="auto", stall_notice=0.3)
    it = iter(loader)
    in_flight, check = [], None
    for k, _ in enumerate(it):
        in_flight.append(loader.stats()["workers"][0]["in_flight"] or 0)
        if k == batches - 1:  # its workers still run: what stoker doctor sees of this loader
            mine = [ld for ld in top.snapshot() if ld["pid"] == os.getpid()]
            check = doctor.waiting_or_computing(mine)
    return in_flight, check, it._load.cpus
