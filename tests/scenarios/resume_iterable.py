"""Scenario of tests/loader/resume/test_iterable.py: load_state_dict on a live iterator after one
worker's stream ended, in a fresh process."""

from __future__ import annotations

import stoker
from resume_datasets import UnevenStream


def load_state_after_a_stream_ended(persistent):
    """load_state_dict on the live iterator after worker 0's stream ended starts over from it."""
    def make():
        return stoker.DataLoader(UnevenStream(), batch_size=None, num_workers=2,
                                 persistent_workers=persistent)

    whole = [int(x) for x in make()]
    loader = make()
    it = iter(loader)
    first = [int(next(it))]
    after_one = loader.state_dict()
    first += [int(next(it)) for _ in range(11)]  # past worker 0's two items: its stream ended
    assert sum(1 for x in first if x < 1000) == 2, first
    loader.load_state_dict(after_one)
    again = [int(x) for x in it]
    assert first[:1] + again == whole, (again, whole)
    assert [int(x) for x in loader] == whole
