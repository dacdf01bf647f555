"""Lightning saves a stoker.DataLoader's state in its checkpoints (the fit loop keeps the
state of loaders that have state_dict) and gives it back on resume. argv: PHASE DIR.

first: trains a 10-batch epoch, saves a checkpoint after its 5th step (Lightning has fetched the
    6th batch by then: it fetches one ahead) and dies there (a preempted job).
resume: fit(ckpt_path=...) to the end of the epoch.
Each phase writes the indices its training steps saw to DIR/PHASE.json."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import lightning as L  # noqa: E402
import torch  # noqa: E402

import stoker  # noqa: E402
from resume_datasets import Augmented  # noqa: E402

PHASE, OUT = sys.argv[1:3]
CKPT = os.path.join(OUT, "last.ckpt")


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.seen = []

    def training_step(self, batch, i):
        self.seen += batch["index"].tolist()
        return self.layer(batch["torch"]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        return stoker.DataLoader(Augmented(40), batch_size=4, shuffle=True, num_workers=2,
                                 generator=torch.Generator().manual_seed(5))


class SaveAndDie(L.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx == 4:
            trainer.save_checkpoint(CKPT)
            with open(os.path.join(OUT, "first.json"), "w") as f:
                json.dump(pl_module.seen, f)
            os._exit(0)


model = Tiny()
kw = dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
          enable_progress_bar=False, enable_model_summary=False)
if PHASE == "first":
    L.Trainer(max_epochs=1, callbacks=[SaveAndDie()], **kw).fit(model)
    raise AssertionError("the epoch ended before the checkpoint")
state = torch.load(CKPT, weights_only=False)["loops"]["fit_loop"]["state_dict"]
assert state.get("combined_loader"), "Lightning saved no loader state"
L.Trainer(max_epochs=1, **kw).fit(model, ckpt_path=CKPT)
with open(os.path.join(OUT, f"{PHASE}.json"), "w") as f:
    json.dump(model.seen, f)
