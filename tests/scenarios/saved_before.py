"""Loading what stoker 0.1 saved in a process that has not imported stoker yet (a training script
that loads its checkpoint first): the pickle's first stoker name is a module 0.1 had."""

from __future__ import annotations

import sys


def torch_load_first(path):
    import torch

    assert "stoker" not in sys.modules
    saved = torch.load(path, weights_only=False)  # names stoker._checkpoint first
    assert "stoker" in sys.modules  # imported by the unpickler, on its way to the old name
    import stoker

    assert [d["index"] for d in stoker.stats(saved["torch_loader"])["deaths"]] == [5]
    assert [s.index for s in saved["stoker_loader"].skipped] == [5]
