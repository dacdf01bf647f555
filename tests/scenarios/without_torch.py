"""Scenario of tests/test_without_torch.py. This module imports nothing at its top that could
import torch: the scenario hides torch before stoker is imported."""

from __future__ import annotations

import sys

from scenarios import expect_raises  # the standard library only


def engine_delivers_numpy():
    """Without torch the wire format and SharedList work; DataLoader says it needs torch."""
    assert "torch" not in sys.modules, "torch was imported before the scenario hid it"
    sys.modules["torch"] = None  # any `import torch` now fails
    import numpy as np

    import stoker
    from stoker import _stoker

    samples = [{"x": np.full((2, 3), i, np.float32), "y": i, "name": f"s{i}"} for i in range(4)]
    batch = _stoker.decode(_stoker.encode(samples, _stoker.MODE_COLLATE))
    assert type(batch["x"]) is np.ndarray and batch["x"].shape == (4, 2, 3), batch
    assert batch["x"].dtype == np.float32 and batch["y"].tolist() == [0, 1, 2, 3]
    assert batch["name"] == ["s0", "s1", "s2", "s3"]
    sl = stoker.SharedList([{"a": 1}, {"b": 2}])
    assert sl[1] == {"b": 2}
    with expect_raises(ImportError, match="needs PyTorch"):
        stoker.DataLoader  # noqa: B018 (the attribute's lookup is what raises)
