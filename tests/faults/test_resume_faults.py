"""Checkpoints taken around deaths: a worker killed just before the checkpoint, and the main
process itself SIGKILLed mid-epoch and restarted from its last checkpoint in a fresh process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import torch

import stoker
from conftest import HERE
from resume_datasets import Augmented, as_lists

SETUP = """
import os, signal, torch, stoker
from resume_datasets import Augmented, as_lists
def make(workers):
    return stoker.DataLoader(Augmented(40), batch_size=4, shuffle=True, num_workers=workers,
                             generator=torch.Generator().manual_seed(1), seed="per_sample")
ref = as_lists(make(0))
"""


def test_worker_killed_just_before_the_checkpoint(script):
    r = script(SETUP + """
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
print("OK")
""", timeout=120)
    assert "OK" in r.stdout, r.stdout + r.stderr


_TRAIN = """
import os, sys, time, torch, stoker
from resume_datasets import Augmented, as_lists
ckpt, kill_at = sys.argv[1], int(sys.argv[2])
loader = stoker.DataLoader(Augmented(40), batch_size=4, shuffle=True, num_workers=2,
                           generator=torch.Generator().manual_seed(1), seed="per_sample")
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
import json
print("SEEN", json.dumps(seen), flush=True)
"""


def test_main_process_sigkilled_mid_epoch_resumes_in_a_fresh_process(tmp_path):
    ckpt = str(tmp_path / "ckpt.pt")
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-c", _TRAIN, ckpt]
    first = subprocess.Popen(cmd + ["4"], cwd=HERE, env=env, stdout=subprocess.PIPE,
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
    second = subprocess.run(cmd + ["-1"], cwd=HERE, env=env, capture_output=True, text=True,
                            timeout=120)
    assert second.returncode == 0, second.stderr
    steps = [int(x.split()[1]) for x in second.stdout.splitlines() if x.startswith("STEP")]
    assert steps == list(range(5, 10)), second.stdout  # it went on after the 5th batch
    seen = json.loads(second.stdout.split("SEEN ", 1)[1])
    ref = as_lists(stoker.DataLoader(Augmented(40), batch_size=4, shuffle=True,
                                     generator=torch.Generator().manual_seed(1),
                                     seed="per_sample"))
    every = sorted(i for b in seen for i in b[0])
    assert every == list(range(40))  # every sample of the epoch exactly once
    assert json.loads(json.dumps(ref)) == seen  # and the very batches of an uninterrupted run


def test_a_skip_reported_by_a_worker_killed_in_collate_is_recorded_once(script):
    """The worker skips sample 5, reports it, and is killed while collating the rest of that
    batch: the batch is re-issued and reports the skip again, and the loader records it once."""
    r = script("""
import tempfile, stoker
from resume_datasets import FailsAt
from scenario_datasets import KillsInCollateOnce
loader = stoker.DataLoader(FailsAt({5}, 16), batch_size=4, num_workers=2, on_error="skip",
                           collate_fn=KillsInCollateOnce(4, tempfile.mkdtemp()))
got = [i for b in loader for i in b.tolist()]
assert got == [i for i in range(16) if i != 5], got
assert [s.index for s in loader.skipped] == [5], loader.skipped
assert len(loader.deaths) == 1, loader.deaths
print("OK")
""", timeout=60)
    assert "OK" in r.stdout, r.stdout + r.stderr
