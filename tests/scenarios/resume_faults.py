"""Scenarios of tests/loader/resume/test_resume_faults.py: checkpoints taken around deaths, each in a fresh
process; ``train_and_checkpoint`` is the training run the test SIGKILLs and starts again."""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time

import torch

import stoker
from resume_datasets import Augmented, FailsAt, as_lists
from scenario_datasets import KillsInCollateOnce


def make(workers):
    """The loader every run of these scenarios makes: shuffled, seeded per sample."""
    return stoker.DataLoader(Augmented(40), batch_size=4, shuffle=True, num_workers=workers,
                             generator=torch.Generator().manual_seed(1), seed="per_sample")


def worker_killed_just_before_the_checkpoint():
    """A state taken just after a worker holding prefetched batches died resumes exactly."""
    ref = as_lists(make(0))
    loader = make(2)
    it = iter(loader)
    got = as_lists(next(it) for _ in range(3))
    os.kill(it._workers[0].pid, signal.SIGKILL)  # it held prefetched batches
    sd = loader.state_dict()
    assert sd["position"] == 3, sd["position"]
    rest = as_lists(it)  # the run goes on: the dead worker's batches are re-issued
    assert len(loader.deaths) == 1, loader.deaths
    assert got + rest == ref, "re-issued batches differ"  # same values: seeds are per sample
    resumed = make(4)
    resumed.load_state_dict(sd)
    assert got + as_lists(resumed) == ref


def train_and_checkpoint(ckpt, kill_at):
    """A training run: a checkpoint at `ckpt` every step, resumed from; it stops at `kill_at`."""
    # Prints "STEP n" after each step's checkpoint, "SEEN" and every batch once the epoch ends.
    loader = make(2)
    seen = []  # stands for the model: what the checkpointed steps have learnt from
    if os.path.exists(ckpt):
        state = torch.load(ckpt)
        loader.load_state_dict(state["loader"])
        seen = state["seen"]
    for step, batch in enumerate(loader, start=len(seen)):
        seen += as_lists([batch])
        torch.save({"loader": loader.state_dict(), "seen": seen}, ckpt + ".tmp")
        os.replace(ckpt + ".tmp", ckpt)  # a checkpoint after every step
        print("STEP", step, flush=True)
        if step == kill_at:
            time.sleep(600)  # killed here, mid-epoch
    print("SEEN", json.dumps(seen), flush=True)


def skip_reported_by_a_worker_killed_in_collate():
    """A skip reported by a worker then killed while collating that batch is recorded once."""
    loader = stoker.DataLoader(FailsAt({5}, 16), batch_size=4, num_workers=2, on_error="skip",
                               collate_fn=KillsInCollateOnce(4, tempfile.mkdtemp()))
    got = [i for b in loader for i in b.tolist()]
    assert got == [i for i in range(16) if i != 5], got
    assert [s.index for s in loader.skipped] == [5], loader.skipped
    assert len(loader.deaths) == 1, loader.deaths
