"""The last mile on a real CUDA GPU (run by benchmarks/gpu/run.sh; skipped without one).

The fake in tests/fake_cuda.py checks the ordering rules on the CPU; this checks that the real
runtime does what the fake models: views of registered slots are pinned memory, async copies
from them and the device stage give torch's values while the GPU is kept busy, and kills and
resume hold on the device path."""

from __future__ import annotations

import pytest
import torch

import scenario_datasets  # tests/ (run.sh puts it on the path)
import stoker

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

N, B, WIDTH = 256, 8, 1 << 18  # 32 batches of 8 x 1 MiB


def wide(n=N, **kw):  # the dataset, at this file's width
    return scenario_datasets.Wide(n, WIDTH, **kw)


def busy():
    """Keeps the current stream busy for a few ms, so late copies would show."""
    a = torch.randn(2048, 2048, device="cuda")
    for _ in range(4):
        a = a @ a
        a = a / a.norm()
    return a


def expected(k):
    return torch.arange(k * B, k * B + B, dtype=torch.float32).repeat_interleave(WIDTH)


def check(batches_on_device):
    torch.cuda.synchronize()
    for k, (x, y) in enumerate(batches_on_device):
        assert y.tolist() == list(range(k * B, k * B + B))
        assert torch.equal(x.flatten().cpu(), expected(k)), f"batch {k} has another's values"


def test_pinned_batches_are_pinned_views():
    ld = stoker.DataLoader(wide(), batch_size=B, num_workers=2, pin_memory=True)
    out = []
    for b in ld:
        assert b["x"].is_pinned() and b["y"].is_pinned()
        busy()
        out.append((b["x"].to("cuda", non_blocking=True), b["y"].to("cuda", non_blocking=True)))
        del b  # the copy may still be reading the slot
    check(out)


@pytest.mark.parametrize("workers", [0, 2])
def test_device_batches_equal_torchs(workers):
    ld = stoker.DataLoader(wide(), batch_size=B, num_workers=workers, device="cuda")
    out = []
    for b in ld:
        assert b["x"].is_cuda
        busy()
        out.append((b["x"] * 1, b["y"] * 1))  # read on the user's stream
    check(out)


def test_device_batches_on_a_user_stream():
    ld = stoker.DataLoader(wide(), batch_size=B, num_workers=2, device="cuda")
    s = torch.cuda.Stream()
    out = []
    with torch.cuda.stream(s):
        for b in ld:
            busy()
            out.append((b["x"] * 1, b["y"] * 1))
    s.synchronize()
    check(out)


def test_device_kill_restart_and_resume(tmp_path):
    ds = wide(die_at=37, marker=str(tmp_path / "died"))
    ld = stoker.DataLoader(ds, batch_size=B, num_workers=2, device="cuda")
    it = iter(ld)
    out = [(b["x"] * 1, b["y"] * 1) for b in (next(it) for _ in range(10))]
    sd = ld.state_dict()
    del it
    again = stoker.DataLoader(wide(), batch_size=B, num_workers=2, device="cuda")
    again.load_state_dict(sd)
    out += [(b["x"] * 1, b["y"] * 1) for b in again]
    check(out)
    assert [d.index for d in ld.deaths] == [37]


def test_enable_pins_torch_loaders():
    stoker.enable()
    try:
        ld = torch.utils.data.DataLoader(wide(64), batch_size=B, num_workers=2, pin_memory=True)
        assert all(b["x"].is_pinned() for b in ld)
    finally:
        stoker.disable()


@pytest.mark.parametrize("how", ["pin_memory", "device"])
def test_values_equal_torchs_loader(how):
    """torch's loader with pin_memory=True and .to(non_blocking=True) is the reference."""
    from stoker.tools.bench.workloads import ImageTensors

    ref = [(x.to("cuda", non_blocking=True), y.to("cuda", non_blocking=True))
           for x, y in torch.utils.data.DataLoader(ImageTensors(512), batch_size=64,
                                                   num_workers=2, pin_memory=True)]
    kw = {"pin_memory": True} if how == "pin_memory" else {"device": "cuda"}
    got = []
    for x, y in stoker.DataLoader(ImageTensors(512), batch_size=64, num_workers=2, **kw):
        busy()
        if how == "pin_memory":
            x, y = x.to("cuda", non_blocking=True), y.to("cuda", non_blocking=True)
        got.append((x * 1, y * 1))
    torch.cuda.synchronize()
    assert len(got) == len(ref)
    for (a, b), (c, d) in zip(got, ref):
        assert torch.equal(a, c) and torch.equal(b, d)
