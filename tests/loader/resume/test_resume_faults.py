"""Checkpoints taken around deaths: a worker killed just before the checkpoint, and the main
process itself SIGKILLed mid-epoch and restarted from its last checkpoint in a fresh process."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import torch

import stoker
from resume_datasets import Augmented, as_lists
from support.scenarios import HERE, run_ok, scenario_command, scenario_env


def test_worker_killed_just_before_the_checkpoint():
    run_ok("resume_faults.worker_killed_just_before_the_checkpoint", timeout=120)


def test_main_process_sigkilled_mid_epoch_resumes_in_a_fresh_process(tmp_path):
    ckpt = str(tmp_path / "ckpt.pt")
    # killed on purpose: the first run never ends with OK
    first = subprocess.Popen(scenario_command("resume_faults.train_and_checkpoint", ckpt, 4),
                             cwd=HERE, env=scenario_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        for line in first.stdout:
            if line.startswith("STEP 4"):
                break
        else:
            raise AssertionError("the first run ended early:\n" + first.stderr.read())
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=60)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    second = run_ok("resume_faults.train_and_checkpoint", ckpt, -1, timeout=120)
    steps = [int(x.split()[1]) for x in second.stdout.splitlines() if x.startswith("STEP")]
    assert steps == list(range(5, 10)), second.stdout  # it went on after the 5th batch
    (seen,) = [json.loads(x.split(" ", 1)[1]) for x in second.stdout.splitlines()
               if x.startswith("SEEN ")]
    ref = as_lists(stoker.DataLoader(Augmented(40), batch_size=4, shuffle=True,
                                     generator=torch.Generator().manual_seed(1),
                                     seed="per_sample"))
    every = sorted(i for b in seen for i in b[0])
    assert every == list(range(40))  # every sample of the epoch exactly once
    assert json.loads(json.dumps(ref)) == seen  # and the very batches of an uninterrupted run


def test_a_skip_reported_by_a_worker_killed_in_collate_is_recorded_once():
    """The worker skips sample 5, reports it, and is killed while collating the rest of that
    batch: the batch is re-issued and reports the skip again, and the loader records it once."""
    run_ok("resume_faults.skip_reported_by_a_worker_killed_in_collate", timeout=60)
