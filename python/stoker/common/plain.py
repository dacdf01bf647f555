"""Plain data: what a checkpoint may hold, so that loading one never runs code.

A checkpoint travels between machines, jobs and people; ``torch.load(weights_only=True)`` (torch's
default since 2.6) and ``torch.distributed.checkpoint`` load only plain values. Everything
``state_dict()`` returns is therefore made of ``None``, ``bool``, ``int``, ``float``, ``str``,
``bytes`` (opaque buffers, never unpickled), lists, tuples, dicts with str or int keys, and
tensors. ``to_plain`` converts what has a plain equivalent (NumPy scalars to Python numbers,
NumPy arrays to tensors) and refuses the rest with a ``TypeError`` naming the type and where it
sits; ``is_plain`` checks a value without changing it; ``digest`` is a checksum of plain data
that does not depend on what a checkpoint format does to it (tuples read back as lists, dicts
reordered); ``loads_plain`` reads a pickle that may only hold plain values (states saved by
stoker 0.1 pickled a stream's state), refusing any other object before it is built.

Pure functions; any thread.
"""

from __future__ import annotations

import base64
import hashlib
import io
import pickle
import struct
import sys

ALLOWED = ("None, bool, int, float, str, bytes, lists, tuples, dicts with str or int keys and "
           "tensors")
_SCALARS = (type(None), bool, int, float, str, bytes)


def _tensor_type():
    torch = sys.modules.get("torch")
    return torch.Tensor if torch is not None else ()


def to_plain(value, where: str = "the state"):
    """`value` as plain data (a new object where something was converted). TypeError names
    what cannot be, with its path (``where['key'][2]``)."""
    if isinstance(value, _SCALARS):
        return value
    t = type(value)
    np = sys.modules.get("numpy")
    if np is not None:
        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, np.ndarray):
            if value.dtype.hasobject:
                raise TypeError(f"{where} is a NumPy array of Python objects: a checkpoint holds "
                                f"only {ALLOWED}")
            import torch

            return torch.from_numpy(np.ascontiguousarray(value).copy())
    tensor = _tensor_type()
    if tensor and isinstance(value, tensor):
        if t is not tensor:
            raise TypeError(f"{where} is a {t.__module__}.{t.__qualname__} (a tensor subclass): "
                            f"a checkpoint holds only {ALLOWED}")
        return value.detach().cpu() if value.device.type != "cpu" else value.detach()
    if t in (list, tuple):
        return t(to_plain(v, f"{where}[{i}]") for i, v in enumerate(value))
    if t is dict:
        out = {}
        for k, v in value.items():
            k = _plain_key(k, where)
            out[k] = to_plain(v, f"{where}[{k!r}]")
        return out
    raise TypeError(f"{where} is a {t.__module__}.{t.__qualname__}: a checkpoint holds only "
                    f"{ALLOWED}. Store its parts (positions, seeds, names) instead.")


def _plain_key(k, where):
    np = sys.modules.get("numpy")
    if np is not None and isinstance(k, np.integer):
        return int(k)
    if isinstance(k, (str, int)) and not isinstance(k, bool):
        return k
    raise TypeError(f"{where} has a key of type {type(k).__name__} ({k!r}): a checkpoint's dicts "
                    "have str or int keys")


def is_plain(value) -> bool:
    """True when `value` is plain data as it is (no conversion needed)."""
    if isinstance(value, _SCALARS):
        return True
    t = type(value)
    if t in (list, tuple):
        return all(is_plain(v) for v in value)
    if t is dict:
        return all(isinstance(k, (str, int)) and not isinstance(k, bool) and is_plain(v)
                   for k, v in value.items())
    tensor = _tensor_type()
    return bool(tensor) and t is tensor


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(
            f"it holds a {module}.{name}, which a checkpoint may not hold (only {ALLOWED} "
            "without tensors): loading it could run code")


def loads_plain(data: bytes):
    """A pickle of plain values (no tensors), read without building any other object: a
    pickle that names a class or a function is refused (``pickle.UnpicklingError``) before
    anything of it runs."""
    return _PlainUnpickler(io.BytesIO(data)).load()


def digest(value, str_keys: bool = False) -> str:
    """A SHA-256 of plain data, the same for equal values whatever a checkpoint format does to
    their containers (a tuple read back as a list, a dict in another order); with `str_keys`,
    also whatever JSON does to them (an int key read back as a str)."""
    h = hashlib.sha256()
    _feed(h, value, str_keys)
    return h.hexdigest()


def b64encode(b: bytes | None) -> str | None:
    """A buffer as text (what JSON holds); None stays None."""
    return None if b is None else base64.b64encode(b).decode("ascii")


def b64decode(s) -> bytes | None:
    """What ``b64encode`` wrote; ValueError for anything else."""
    if s is None:
        return None
    if not isinstance(s, str):
        raise ValueError(f"expected base64 text, got {type(s).__name__}")
    return base64.b64decode(s.encode("ascii"), validate=True)


def _feed(h, v, str_keys: bool = False) -> None:
    if v is None:
        h.update(b"N")
    elif isinstance(v, bool):
        h.update(b"T" if v else b"F")
    elif isinstance(v, int):
        b = str(v).encode()
        h.update(b"i" + struct.pack("<I", len(b)) + b)
    elif isinstance(v, float):
        h.update(b"f" + v.hex().encode() + b";")
    elif isinstance(v, str):
        b = v.encode("utf-8", "surrogatepass")
        h.update(b"s" + struct.pack("<Q", len(b)) + b)
    elif isinstance(v, (bytes, bytearray)):
        h.update(b"b" + struct.pack("<Q", len(v)) + bytes(v))
    elif isinstance(v, (list, tuple)):
        h.update(b"l" + struct.pack("<Q", len(v)))
        for x in v:
            _feed(h, x, str_keys)
    elif isinstance(v, dict):
        h.update(b"d" + struct.pack("<Q", len(v)))
        if str_keys:
            items = sorted(((str(k), x) for k, x in v.items()), key=lambda kx: kx[0])
        else:
            items = [(k, v[k]) for k in sorted(v, key=lambda k: (type(k).__name__, repr(k)))]
        for k, x in items:
            _feed(h, k, str_keys)
            _feed(h, x, str_keys)
    elif _tensor_type() and isinstance(v, _tensor_type()):
        t = v.detach().cpu().contiguous()
        meta = f"{t.dtype}|{tuple(t.shape)}".encode()
        raw = t.reshape(-1).view(__import__("torch").uint8).numpy().tobytes() if t.numel() else b""
        h.update(b"t" + struct.pack("<I", len(meta)) + meta + struct.pack("<Q", len(raw)) + raw)
    else:
        raise TypeError(f"not plain data: {type(v).__name__}")
