"""How ``stoker_0_1_loaders_with_a_death.pt`` was made, with stoker 0.1 itself (commit 2222227):

    git archive 2222227 python/stoker tests/scenario_datasets.py | tar -x -C /tmp/stoker01
    (link the built extension into /tmp/stoker01/python/stoker)
    cd /tmp/stoker01 && PYTHONPATH=python:tests python make_stoker_0_1_loaders_with_a_death.py OUT

It ``torch.save``s two loaders whose worker was killed (SIGKILL) loading index 5, which 0.1 then
quarantined and skipped: a torch DataLoader served by ``stoker.enable()`` (its pickle names
``stoker._checkpoint`` before anything else of stoker) and a ``stoker.DataLoader``. It does not
run against today's stoker (it checks it is 0.1); tests/_compat/test_saved_before.py reads its
output.
"""

import signal
import sys

import torch
from torch.utils.data import DataLoader

import stoker
from scenario_datasets import KillsSelfAt

assert stoker.__version__ == "0.1.0", "run this with stoker 0.1 (see the docstring)"
ds = KillsSelfAt(bad=5, signum=signal.SIGKILL, n=12)
stoker.enable(on_error="skip", quarantine_after=1)
torch_loader = DataLoader(ds, batch_size=2, num_workers=2)
torch_batches = [b[1].tolist() for b in torch_loader]
stoker.disable()
stoker_loader = stoker.DataLoader(ds, batch_size=2, num_workers=2, on_error="skip",
                                  quarantine_after=1)
stoker_batches = [b[1].tolist() for b in stoker_loader]
assert torch_batches == stoker_batches == [[0, 1], [2, 3], [4], [6, 7], [8, 9], [10, 11]]
torch.save({"torch_loader": torch_loader, "stoker_loader": stoker_loader,
            "batches": stoker_batches}, sys.argv[1])
