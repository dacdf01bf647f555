"""Puts stoker.DataLoader where torch's DataLoader is, in every Python process of a suite run.

Python imports ``sitecustomize`` at start-up from the first directory on ``sys.path`` that has one;
run.py puts this directory first on PYTHONPATH, so the pytest process, the processes torch's tests
start themselves (``mp.get_context('spawn')``, ``subprocess.check_output([sys.executable, '-c',
...])``) and the loader's workers all run this before any test code. It acts only when
STOKER_TORCH_SUITE_LOADER is ``stoker``; with any other value the process is left as it is.

The test module does ``from torch.utils.data import DataLoader``, which copies whatever
``torch.utils.data.DataLoader`` is at that moment, so the attribute must be replaced before the module
is imported: doing it here, at interpreter start, is what makes the substitution reach that name
too. ``torch.utils.data.dataloader.DataLoader`` is replaced as well, for code that imports it from
the submodule. stoker.DataLoader subclasses torch's class, which it bound when it was defined, so
replacing the module attributes afterwards does not change stoker's own base class.
"""

import os

if os.environ.get("STOKER_TORCH_SUITE_LOADER") == "stoker":
    import torch.utils.data
    import torch.utils.data.dataloader

    import stoker

    torch.utils.data.DataLoader = stoker.DataLoader
    torch.utils.data.dataloader.DataLoader = stoker.DataLoader
