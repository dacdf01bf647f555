"""Scenarios of the Ray placement's tests (tests/placements/ray/cluster/test_cluster.py): processes the test kills."""

from __future__ import annotations

import stoker
from scenario_datasets import Slow


def train_until_killed(address: str) -> None:
    """A training process whose workers are actors at `address`: says RUNNING once its first
    batch arrived, then loads until it is killed."""
    loader = stoker.DataLoader(Slow(100_000), batch_size=2, num_workers=2,
                               placement=stoker.Ray(address=address))
    it = iter(loader)
    next(it)
    print("RUNNING", flush=True)
    for _ in it:
        pass
