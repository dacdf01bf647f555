"""Tensors whose memory is not their value, and odd tuple types, come out as torch's do."""

from __future__ import annotations

import pytest
import torch

import stoker
from scenario_datasets import NegatedViews


@pytest.mark.parametrize("batch_size", [None, 2])
def test_lazily_negated_and_conjugated_views_keep_their_values(batch_size):
    ours = list(stoker.DataLoader(NegatedViews(), batch_size=batch_size, num_workers=2))
    theirs = list(torch.utils.data.DataLoader(NegatedViews(), batch_size=batch_size))
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        for x, y in zip(a, b):
            assert torch.equal(x.resolve_conj().resolve_neg(), y.resolve_conj().resolve_neg())
