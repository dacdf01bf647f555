"""The checkpointing users already have picks up stoker's state, across a real process death:
Lightning's fit loop (it saves the state of loaders that have state_dict) and accelerate's
save_state/load_state (with register_for_checkpointing, the one line accelerate needs: its
use_stateful_dataloader builds torchdata's loader instead of keeping yours).
torch.distributed.checkpoint is in test_state_dict.py. Each run dies right after its checkpoint
(os._exit) and a fresh process resumes; every sample of the epoch must be trained on exactly
once across the two. Scripts live in tests/frameworks/."""

from __future__ import annotations

import json
import os

from support.frameworks import SCRIPTS, needs, run


def two_runs(script, tmp_path):
    for phase in ("first", "resume"):
        run([os.path.join(SCRIPTS, script), phase, str(tmp_path)], tmp_path, timeout=240,
            env={"OMP_NUM_THREADS": "1"})
    return [json.loads((tmp_path / f"{p}.json").read_text()) for p in ("first", "resume")]


@needs("lightning")
def test_lightning_resumes_a_preempted_epoch_from_its_checkpoint(tmp_path):
    first, resumed = two_runs("lightning_resume.py", tmp_path)
    assert len(first) == 20  # 5 steps of 4 samples, then the process died
    assert sorted(first + resumed) == list(range(40))


@needs("accelerate")
def test_accelerate_save_state_and_load_state_carry_the_loader(tmp_path):
    first, resumed = two_runs("accelerate_resume.py", tmp_path)
    assert len(first) == 16
    assert sorted(first + resumed) == list(range(40))
