"""Lightning trains a tiny model on CPU; each rank reports the samples it saw and whether a
stoker worker loaded them. argv: KIND (stoker: stoker.DataLoader | enable: stoker.enable() and a
torch DataLoader), STRATEGY (single | ddp | ddp_spawn), WHERE (hook | fit), REPORT path."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import lightning as L  # noqa: E402
import torch  # noqa: E402

import stoker  # noqa: E402
from framework_data import Probe, report  # noqa: E402

KIND, STRATEGY, WHERE, REPORT = sys.argv[1:5]


def make_loader():
    if KIND == "stoker":
        return stoker.DataLoader(Probe(), batch_size=2, num_workers=2, on_error="skip",
                                 max_retries=0)
    return torch.utils.data.DataLoader(Probe(), batch_size=2, num_workers=2)


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.seen, self.engine = [], []

    def training_step(self, batch, i):
        self.seen += batch["idx"].tolist()
        self.engine += batch["engine"].tolist()
        return torch.nn.functional.mse_loss(self.layer(batch["x"]).squeeze(1), batch["y"])

    def on_train_end(self):
        loader = self.trainer.train_dataloader
        report(REPORT, self.global_rank, self.seen, self.engine,
               {"served_by": stoker.stats(loader)["served_by"],
                "loader": type(loader).__name__,
                "sampler": type(loader.sampler).__name__,
                "on_error": getattr(loader, "on_error", None)})

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class FromHook(Tiny):
    def train_dataloader(self):
        return make_loader()


if __name__ == "__main__":
    if KIND == "enable":
        stoker.enable(on_error="skip", max_retries=0)
    devices = 1 if STRATEGY == "single" else 2
    trainer = L.Trainer(accelerator="cpu", devices=devices,
                        strategy="auto" if STRATEGY == "single" else STRATEGY, max_epochs=1,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    if WHERE == "hook":
        trainer.fit(FromHook())
    else:
        trainer.fit(Tiny(), train_dataloaders=make_loader())
    print("TRAINED", trainer.global_step)
