"""accelerate checkpoints a stoker.DataLoader registered with register_for_checkpointing:
save_state() writes its state, load_state() gives it back. argv: PHASE DIR.

first: takes 4 batches of a 10-batch epoch, save_state(DIR/ckpt), and dies there.
resume: load_state(DIR/ckpt), then the rest of the epoch.
Each phase writes the indices it received to DIR/PHASE.json."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402

import stoker  # noqa: E402
from resume_datasets import Augmented  # noqa: E402

PHASE, OUT = sys.argv[1:3]
CKPT = os.path.join(OUT, "ckpt")

accelerator = Accelerator(cpu=True)
loader = stoker.DataLoader(Augmented(40), batch_size=4, shuffle=True, num_workers=2,
                           generator=torch.Generator().manual_seed(5))
accelerator.register_for_checkpointing(loader)  # the line that makes accelerate see it
seen = []
if PHASE == "first":
    it = iter(loader)
    for _ in range(4):
        seen += next(it)["index"].tolist()
    accelerator.save_state(CKPT)
else:
    accelerator.load_state(CKPT)
    for batch in loader:
        seen += batch["index"].tolist()
with open(os.path.join(OUT, f"{PHASE}.json"), "w") as f:
    json.dump(seen, f)
if PHASE == "first":
    os._exit(0)  # preempted: no clean shutdown
