"""Datasets, samplers, collate and worker_init functions for ``test_compat.py``.

Everything lives at module level so that it pickles by reference, which the ``spawn`` and
``forkserver`` start methods need. Every dataset is deterministic given its constructor
arguments and the RNG state of the process that reads it.
"""

from __future__ import annotations

import importlib
import random
from collections import namedtuple

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

Point = namedtuple("Point", ["x", "y"])
Pair = namedtuple("Pair", ["index", "names"])

NUMPY_DTYPES = [
    "bool",
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
]
# np.uint64 scalars are excluded: torch.as_tensor() rejects them ("an integer is required").
NUMPY_SCALAR_DTYPES = [d for d in NUMPY_DTYPES if d != "uint64"]

TORCH_DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
]
# Rarely used dtypes that torch's default_collate nevertheless handles (torch.equal does not).
EXOTIC_TORCH_DTYPES = [
    torch.complex32,
    torch.float8_e4m3fn,
    torch.float8_e4m3fnuz,
    torch.float8_e5m2,
    torch.float8_e5m2fnuz,
    torch.float8_e8m0fnu,
]

LARGE_NUMEL = 2 * 1024 * 1024  # 8 MiB of float32


def _worker_info_api(api):
    """The ``get_worker_info`` of ``torch.utils.data`` or of ``stoker``, resolved in the worker."""
    if api == "torch":
        return get_worker_info
    return importlib.import_module(api).get_worker_info


# --------------------------------------------------------------------------------------------
# Map-style datasets


class TensorLabelDataset(Dataset):
    """``(float32 tensor of shape (3,), int label)``."""

    def __init__(self, n=23):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return torch.arange(3, dtype=torch.float32) + 10 * i, i


class NestedDataset(Dataset):
    """Nested dict / list / tuple / namedtuple / OrderedDict-free structures of tensors."""

    def __init__(self, n=10):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        t = torch.full((2,), float(i))
        return {
            "idx": i,
            "name": f"item-{i}",
            "point": Point(x=t, y=torch.tensor(i, dtype=torch.int32)),
            "pair": (t * 2, [t * 3, {"deep": torch.tensor([i, -i], dtype=torch.int16)}]),
            "list": [torch.tensor(i), np.float32(i) / 4, (i % 2 == 0)],
            "inner": {"a": {"b": {"c": torch.ones(1, 2) * i}}},
        }


class NumpyDtypeDataset(Dataset):
    """A dict of numpy arrays (every numeric dtype) plus numpy scalars and 0-d arrays."""

    def __init__(self, n=7):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        out = {}
        for name in NUMPY_DTYPES:
            arr = (np.arange(6).reshape(2, 3) + i) % 5
            if name == "bool":
                arr = arr % 2 == 0
            elif name.startswith("complex"):
                arr = arr + 1j * (arr - i)
            out[f"arr_{name}"] = np.ascontiguousarray(arr).astype(name)
        for name in ("float16", "float32", "float64", "complex64"):
            special = np.array([np.nan, np.inf, -np.inf, -0.0, i], dtype=name)
            out[f"special_{name}"] = special
        for name in NUMPY_SCALAR_DTYPES:
            out[f"scalar_{name}"] = np.dtype(name).type(i % 2 if name == "bool" else i)
        out["zero_d_array"] = np.array(i * 1.5)
        out["fortran_order"] = np.asfortranarray(np.arange(6.0).reshape(2, 3) * i)
        return out


class TorchDtypeDataset(Dataset):
    """A dict of tensors, one per dtype in ``dtypes``, with NaN/inf in floating ones."""

    def __init__(self, n=7, dtypes=tuple(TORCH_DTYPES)):
        self.n = n
        self.dtypes = list(dtypes)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        out = {}
        for dt in self.dtypes:
            base = (torch.arange(6).reshape(2, 3) + i) % 5
            if dt is torch.bool:
                t = base % 2 == 0
            elif dt.is_complex:
                t = torch.complex(base.float(), (base - i).float()).to(dt)
            else:
                t = base.to(dt)
            out[str(dt)] = t
            if dt.is_floating_point and dt.itemsize >= 2:
                out[f"special_{dt}"] = torch.tensor(
                    [float("nan"), float("inf"), -float("inf"), -0.0, i]
                ).to(dt)
        return out


class ScalarsDataset(Dataset):
    """Python and numpy scalars, str, bytes and 0-d tensors."""

    def __init__(self, n=9):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {
            "int": i,
            "big_int": 2**40 + i,
            "negative_int": -i,
            "float": i / 3,
            "nan_float": float("nan") if i % 3 == 0 else float(i),
            "bool": i % 2 == 1,
            "str": f"s{i}",
            "bytes": bytes([65 + i % 26]) * (i + 1),
            "np_float32": np.float32(i) / 7,
            "np_int16": np.int16(-i),
            "np_bool": np.bool_(i % 3 == 0),
            "t0_float": torch.tensor(i / 2),
            "t0_int": torch.tensor(i),
            "t0_bool": torch.tensor(i % 2 == 0),
            "t0_bf16": torch.tensor(i / 4, dtype=torch.bfloat16),
        }


class OddTensorsDataset(Dataset):
    """Non-contiguous (transposed, sliced, expanded, channels_last) and zero-size tensors."""

    def __init__(self, n=6):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        base = torch.arange(24, dtype=torch.float32).reshape(4, 6) + 100 * i
        return {
            "transposed": base.t(),
            "sliced": base[1:3, ::2],
            "expanded": torch.tensor([float(i), -1.0]).expand(3, 2),
            "channels_last": (torch.arange(2 * 3 * 2 * 2.0).reshape(2, 3, 2, 2) + i).to(
                memory_format=torch.channels_last
            ),
            "empty_rows": torch.zeros(0, 3),
            "empty_1d_int": torch.empty(0, dtype=torch.int64),
            "empty_mid": torch.ones(2, 0, 4, dtype=torch.float64),
            "np_transposed": (np.arange(6).reshape(2, 3) + i).T,
            "np_empty": np.zeros((0, 2), dtype=np.int32),
        }


class LargeDataset(Dataset):
    """Each sample is an 8 MiB float32 tensor plus its index."""

    def __init__(self, n=4):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.arange(LARGE_NUMEL, dtype=torch.float32) * (i + 1), i


class RandomAugDataset(Dataset):
    """Draws from torch, python ``random`` and numpy's global RNGs in ``__getitem__``."""

    def __init__(self, n=12):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        info = get_worker_info()
        return {
            "idx": i,
            "worker": -1 if info is None else info.id,
            "torch": torch.rand(2),
            "torch_int": torch.randint(0, 2**31 - 1, ()),
            "py": random.random(),
            "np": np.random.rand(),
        }


class WorkerInfoDataset(Dataset):
    """Reports what ``get_worker_info()`` (of ``api``) says inside ``__getitem__``."""

    def __init__(self, n=8, api="torch"):
        self.n = n
        self.api = api

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        info = _worker_info_api(self.api)()
        if info is None:
            return {"idx": i, "in_worker": False}
        return {
            "idx": i,
            "in_worker": True,
            "id": info.id,
            "num_workers": info.num_workers,
            "seed": info.seed,
            "dataset_is_self": info.dataset is self,
            "dataset_type": type(info.dataset).__name__,
            "tag": getattr(self, "tag", "untagged"),
        }


class TaggedDataset(Dataset):
    """Returns ``self.tag`` (set by a worker_init_fn) with each index."""

    def __init__(self, n=10):
        self.n = n
        self.tag = "main"

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i, self.tag, getattr(self, "np_draw", -1.0)


class GetItemsDataset(Dataset):
    """Implements ``__getitems__``; its samples say which path produced them."""

    def __init__(self, n=11):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"idx": i, "via_getitems": False, "value": torch.tensor([i, i * i])}

    def __getitems__(self, indices):
        return [
            {"idx": i, "via_getitems": True, "value": torch.tensor([i, i * i])} for i in indices
        ]


class DisabledGetItemsDataset(GetItemsDataset):
    """``__getitems__ = None``: torch checks truthiness, so ``__getitem__`` must be used."""

    __getitems__ = None


class FailingDataset(Dataset):
    """Raises ``exc_type`` for index ``bad``."""

    def __init__(self, n=8, bad=5, exc_type=ValueError):
        self.n = n
        self.bad = bad
        self.exc_type = exc_type

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.bad:
            raise self.exc_type(f"bad index {i}")
        return torch.tensor(i)


class NumpyStringDataset(Dataset):
    """numpy string arrays, which ``default_collate`` rejects with TypeError."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return np.array([f"s{i}"])


# --------------------------------------------------------------------------------------------
# Iterable-style datasets


class ShardedIterable(IterableDataset):
    """Yields ``start..end-1`` split into contiguous shards, one per worker."""

    def __init__(self, start=0, end=23):
        self.start = start
        self.end = end

    def _bounds(self):
        info = get_worker_info()
        if info is None:
            return self.start, self.end
        per = -(-(self.end - self.start) // info.num_workers)
        lo = self.start + info.id * per
        return lo, min(lo + per, self.end)

    def __iter__(self):
        lo, hi = self._bounds()
        for i in range(lo, hi):
            yield {"idx": i, "x": torch.tensor([i, -i], dtype=torch.float32)}


class SizedShardedIterable(ShardedIterable):
    """``ShardedIterable`` with ``__len__``."""

    def __len__(self):
        return self.end - self.start


class NaiveIterable(IterableDataset):
    """No sharding: every worker yields the whole range (duplicates, as in torch)."""

    def __init__(self, n=7):
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        wid = -1 if info is None else info.id
        for i in range(self.n):
            yield torch.tensor(i), wid


class StridedRandomIterable(IterableDataset):
    """Worker k yields indices k, k+W, ... with random draws from all three global RNGs."""

    def __init__(self, n=14):
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        wid, nw = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(wid, self.n, nw):
            yield i, torch.rand(1), random.random(), np.random.rand()


# --------------------------------------------------------------------------------------------
# Samplers


class ReversedSampler(torch.utils.data.Sampler):
    """Deterministic custom sampler: ``n-1, ..., 0``."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n - 1, -1, -1))

    def __len__(self):
        return self.n


# --------------------------------------------------------------------------------------------
# collate_fn


def collate_to_numpy(batch):
    """Returns numpy arrays (not tensors) from ``(tensor, label)`` samples."""
    xs = np.stack([x.numpy() for x, _ in batch])
    ys = np.array([y for _, y in batch], dtype=np.int64)
    return xs, ys


def collate_to_namedtuple(batch):
    return Pair(index=torch.tensor([y for _, y in batch]), names=[f"n{y}" for _, y in batch])


def collate_to_dict_with_strings(batch):
    return {
        "names": [f"sample-{y}" for _, y in batch],
        "label": "batch",
        "x": torch.stack([x for x, _ in batch]),
        "count": len(batch),
    }


def collate_identity(batch):
    return batch


def collate_sum_per_sample(sample):
    """For ``batch_size=None``: applied to one sample at a time."""
    x, y = sample
    return {"sum": x.sum(), "label": y, "doubled": x * 2}


# --------------------------------------------------------------------------------------------
# worker_init_fn


def init_tag_dataset(worker_id):
    """Sets an attribute on this worker's copy of the dataset (via torch's get_worker_info)."""
    info = get_worker_info()
    assert info is not None and info.id == worker_id
    info.dataset.tag = f"worker-{worker_id}-of-{info.num_workers}"


def init_tag_dataset_stoker(worker_id):
    """Like ``init_tag_dataset`` but through ``stoker.get_worker_info``."""
    info = _worker_info_api("stoker")()
    assert info is not None and info.id == worker_id
    info.dataset.tag = f"stoker-worker-{worker_id}-of-{info.num_workers}"


def init_seed_numpy_from_worker_seed(worker_id):
    """The common recipe: seed numpy from ``get_worker_info().seed`` and draw once."""
    info = get_worker_info()
    np.random.seed(info.seed % 2**32)
    info.dataset.np_draw = float(np.random.rand())
    info.dataset.tag = f"seeded-{worker_id}"
