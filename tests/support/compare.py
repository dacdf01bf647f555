"""Comparing what two loaders delivered: the same Python type at every level, the same dtype,
shape, device, layout and bits for tensors and arrays (tests of drop-in fidelity use it)."""

from __future__ import annotations

import collections.abc
import math

import numpy as np
import torch


def _tensor_bits(t):
    """The raw bytes of a tensor, for dtypes torch.equal does not support and NaN-safe checks."""
    flat = t.detach().cpu().contiguous().reshape(-1)
    if flat.dtype is torch.bool:
        flat = flat.to(torch.uint8)
    return flat.view(torch.uint8)


def _tensors_equal(a, b):
    if a.numel() == 0:
        return True
    try:
        if torch.equal(a, b):
            return True
    except (RuntimeError, NotImplementedError):
        pass  # e.g. float8 / complex32: no equal kernel on CPU
    # NaN-safe fallback: bit-for-bit identical contents.
    return torch.equal(_tensor_bits(a), _tensor_bits(b))


def assert_same(a, b, path="batch"):
    """Recursively: same Python type at every level, same dtype/shape/values for arrays."""
    assert type(a) is type(b), f"{path}: type {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype, f"{path}: dtype {a.dtype} != {b.dtype}"
        assert a.shape == b.shape, f"{path}: shape {tuple(a.shape)} != {tuple(b.shape)}"
        assert a.device == b.device, f"{path}: device {a.device} != {b.device}"
        assert a.layout == b.layout, f"{path}: layout {a.layout} != {b.layout}"
        assert _tensors_equal(a, b), f"{path}: values differ\n{a}\n{b}"
    elif isinstance(a, (np.ndarray, np.generic)):
        assert a.dtype == b.dtype, f"{path}: dtype {a.dtype} != {b.dtype}"
        assert np.shape(a) == np.shape(b), f"{path}: shape {np.shape(a)} != {np.shape(b)}"
        nan_ok = a.dtype.kind in "fc"
        assert np.array_equal(a, b, equal_nan=nan_ok), f"{path}: values differ\n{a}\n{b}"
    elif isinstance(a, float):
        assert a == b or (math.isnan(a) and math.isnan(b)), f"{path}: {a!r} != {b!r}"
    elif isinstance(a, collections.abc.Mapping):
        assert list(a.keys()) == list(b.keys()), f"{path}: keys {list(a)} != {list(b)}"
        for key in a:
            assert_same(a[key], b[key], f"{path}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{path}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"
