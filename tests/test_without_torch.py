"""The engine, the wire format and SharedList work in a process where torch cannot be imported."""

from __future__ import annotations


def test_engine_without_torch_delivers_numpy(scenario):
    r = scenario("without_torch.engine_delivers_numpy", timeout=60)
    assert "OK" in r.stdout, r.stdout + r.stderr
