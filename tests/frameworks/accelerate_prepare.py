"""accelerate's prepare() on a stoker.DataLoader (KIND=stoker), or on a torch DataLoader after
stoker.enable(on_error="skip") (KIND=enable) or unchanged (KIND=plain: for `stoker run`), in 1
process or one per rank under torchrun. argv: KIND REPORT."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402

import stoker  # noqa: E402
from framework_data import Probe, report  # noqa: E402

KIND, REPORT = sys.argv[1:3]

if __name__ == "__main__":
    if KIND == "stoker":
        loader = stoker.DataLoader(Probe(), batch_size=2, num_workers=2, on_error="skip")
    else:
        if KIND == "enable":
            stoker.enable(on_error="skip")
        loader = torch.utils.data.DataLoader(Probe(), batch_size=2, num_workers=2)
    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt, prepared = acc.prepare(model, opt, loader)
    seen, engine = [], []
    for batch in prepared:
        seen += batch["idx"].tolist()
        engine += batch["engine"].tolist()
        loss = torch.nn.functional.mse_loss(model(batch["x"]).squeeze(1), batch["y"])
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
    inner = prepared.base_dataloader
    report(REPORT, acc.process_index, seen, engine,
           {"served_by": stoker.stats(inner)["served_by"], "loader": type(inner).__name__,
            "world": acc.num_processes})
