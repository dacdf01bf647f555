"""The engine, the wire format and SharedList work in a process where torch cannot be imported."""

from __future__ import annotations

from support.scenarios import run_ok


def test_engine_without_torch_delivers_numpy():
    run_ok("without_torch.engine_delivers_numpy", timeout=60)
