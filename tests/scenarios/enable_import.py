"""A scenario of tests/loader/integrations/test_enable.py kept apart from ``enable.py``: this module imports nothing
at its top, so that the scenario sees what ``import stoker`` alone imports."""

from __future__ import annotations

import sys


def dataloader_is_imported_with_the_package():
    """Prints whether `import stoker` imported stoker.loader.dataloader and stoker.DataLoader with it."""
    assert "stoker" not in sys.modules, "stoker was imported before the scenario ran"
    import stoker

    print("stoker.loader.dataloader" in sys.modules, "DataLoader" in vars(stoker))
