"""Pickling for what the wire format cannot lay out flat.

Plain pickle, except for torch tensors that DLPack cannot export (float8, complex32, conjugate
views...): torch's own pickling of those relies on its shared-memory reductions, so they travel
here as their raw bytes plus dtype and shape, and are rebuilt as the same tensor. Meta and nested
tensors, and tensor subclasses, use torch's plain pickling, as torch.save does. A function or
class that pickle cannot find by name goes by value (``pickling.by_value``): a worker's batch may hold an
instance of a class the main process sent it that way (a sample type of ``python -c``).

Pure functions: any thread (the worker's encoder calls ``dumps``).
"""

from __future__ import annotations

import io
import pickle
import sys
import threading

from . import by_value as _by_value


def _rebuild_tensor(dtype_name, shape, raw, device, requires_grad):
    import torch

    dtype = getattr(torch, dtype_name)
    flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
    t = flat.view(dtype).reshape(shape)
    if device != "cpu":
        t = t.to(device)
    if requires_grad:
        t.requires_grad_(True)
    return t


class Pickler(_by_value.Pickler):
    """``pickle.Pickler`` with the tensor rule above, and what pickle refuses by name by value
    (``pickling.by_value``: a worker's batch may hold instances of a class the main process sent it by
    value). It pickles what a worker sends back; ``wire.sealed`` subclasses it for what goes
    to workers."""

    to_worker = False
    busy = False

    def __init__(self, file, protocol: int = pickle.HIGHEST_PROTOCOL, buffer_callback=None,
                 forking: bool = False):
        super().__init__(file, protocol, buffer_callback=buffer_callback, forking=forking)
        self.file = file

    def reduce_other(self, obj):
        torch = sys.modules.get("torch")
        if torch is None or type(obj) is not torch.Tensor or obj.layout != torch.strided:
            return NotImplemented
        if obj.is_nested or obj.is_meta:
            # torch's own pickling keeps them (a meta tensor has no bytes; a nested tensor's
            # buffer is a plain tensor, which comes back here).
            return NotImplemented
        t = obj.detach().cpu().resolve_conj().resolve_neg().contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        dtype_name = str(t.dtype).split(".")[-1]
        return (_rebuild_tensor, (dtype_name, tuple(t.shape), raw, str(obj.device), obj.requires_grad))


_mine = threading.local()  # this thread's pickler, reused: a batch pickles a leaf at a time


def dumps(obj, protocol: int = pickle.HIGHEST_PROTOCOL) -> bytes:
    """`obj` pickled as above. A thread reuses one pickler (its memo cleared each time: the
    encoder calls this for every leaf it cannot lay out flat), unless a pickle is already under
    way in it (an object's own reduction that pickles), or the reductions changed since."""
    p = getattr(_mine, "pickler", None)
    if p is None or p.busy or p.proto != protocol or p.stale():
        p = Pickler(io.BytesIO(), protocol=protocol)
        _mine.pickler = p
    out = p.file
    out.seek(0)
    out.truncate()
    p.clear_memo()
    p.forget_globals()
    p.busy = True
    try:
        p.dump(obj)
        return out.getvalue()
    finally:
        p.busy = False
