"""Mosaic's streaming (mosaicml-streaming 0.13) under stoker, on local MDS shards this test
writes: its StreamingDataset has state_dict(num_samples, from_beginning), which is not the
Stateful protocol, so stoker runs it as torch runs it; under stoker.DataLoader, under enable(),
and with Mosaic's own StreamingDataLoader and its resume path.

Runs in the vision venv (`make test-vision`): `import streaming` imports torchvision and
transformers 4, which need torch 2.14.1's build.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from streaming import MDSWriter, StreamingDataLoader, StreamingDataset
from streaming.base.util import clean_stale_shared_memory

import stoker

N = 96


@pytest.fixture
def shards(tmp_path):
    out = tmp_path / "mds"
    with MDSWriter(out=str(out), columns={"id": "int", "x": "ndarray:float32:4"},
                   size_limit=1 << 12) as w:  # several shards
        for i in range(N):
            w.write({"id": i, "x": np.full(4, i, dtype=np.float32)})
    yield str(out)
    clean_stale_shared_memory()


def _dataset(shards):
    return StreamingDataset(local=shards, batch_size=8, shuffle=False,
                            remote=None, predownload=8, keep_zip=False,
                            sampling_granularity=1)


def _ids(batches):
    return [int(i) for b in batches for i in b["id"]]


def test_streaming_dataset_under_stoker_dataloader(shards):
    ds = _dataset(shards)
    loader = stoker.DataLoader(ds, batch_size=8, num_workers=2)
    got = _ids(loader)
    assert sorted(got) == list(range(N))
    # Its state_dict(num_samples, from_beginning) is not the Stateful protocol: the workers'
    # states carry their position and generators, never a "dataset" taken from it.
    states = dict(loader.state_dict()["worker_states"])
    assert sorted(states) == [0, 1]
    assert all("dataset" not in s and s["ended"] for s in states.values())
    first = next(iter(loader))
    assert torch.equal(first["x"][:, 0], first["id"].float())


def test_streaming_dataloader_resumes_under_enable(shards):
    """StreamingDataLoader's own resume: its state (samples seen) loaded into a new loader
    gives the rest of the epoch, once each, under stoker's engine; torch's loader agrees."""
    def run(enabled):
        if enabled:
            stoker.enable()
        try:
            ds = _dataset(shards)
            dl = StreamingDataLoader(ds, batch_size=8, num_workers=2)
            it = iter(dl)
            head = _ids(next(it) for _ in range(3))
            sd = dl.state_dict()
            served = stoker.stats(dl)["served_by"]
            del it, dl, ds
            clean_stale_shared_memory()
            ds = _dataset(shards)
            dl = StreamingDataLoader(ds, batch_size=8, num_workers=2)
            dl.load_state_dict(sd)
            rest = _ids(dl)
            del dl, ds
            clean_stale_shared_memory()
            return head, rest, served
        finally:
            stoker.disable()

    head, rest, served = run(True)
    assert served == "stoker.enable()"
    assert len(head) == 24 and sorted(head + rest) == list(range(N))
    torch_head, torch_rest, _ = run(False)
    assert (head, rest) == (torch_head, torch_rest)
