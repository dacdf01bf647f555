"""Dataset indices, normalised: the one place that decides what an index "is".

A sampler may yield anything a dataset accepts: Python ints, NumPy or 0-d tensor ints, strings,
tuples, tensors. The loader needs four views of one:

- ``as_int``: an int when the index is one of any kind (the worker's status page holds int64);
- ``key``: a hashable stand-in, equal for equal indices (quarantine, skip records, deaths);
- ``seed_key``: 64 bits stable across processes and runs (per-sample seeding);
- ``jsonable``: what ``stats()`` shows.

Pure functions, safe from any thread.
"""

from __future__ import annotations

import operator
import zlib

_M64 = (1 << 64) - 1


def as_int(index) -> int | None:
    """`index` as an int when it is one (int, NumPy or 0-d tensor ints), else None."""
    if type(index) is int:
        return index
    try:
        return operator.index(index)
    except TypeError:
        return None


def key(index):
    """A hashable stand-in for `index`: ints of every kind as int, other hashables as themselves,
    the rest (lists, tensors...) by repr."""
    n = as_int(index)
    if n is not None:
        return n
    try:
        hash(index)
        return index
    except TypeError:
        return repr(index)


def mix(x: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit function of `x`."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def seed_key(index) -> int:
    """64 bits for `index`: ints as themselves, a batch of indices (what ``__getitems__``
    receives) mixed element by element, anything else by a CRC of its repr (stable across
    processes, unlike ``hash()`` of a str)."""
    if type(index) is int:
        return index & _M64
    if isinstance(index, (list, tuple)):
        h = len(index)
        for i in index:
            h = mix(h ^ seed_key(i))
        return h
    n = as_int(index)
    if n is not None:
        return n & _M64
    return zlib.crc32(repr(index).encode("utf-8", "replace"))


def plain_index(index):
    """`index` as plain data for a checkpoint (``common.plain``): NumPy and tensor ints as int, plain
    values as themselves, anything else by its repr (a checkpoint never holds an object)."""
    n = as_int(index)
    if n is not None and not isinstance(index, bool):
        return n
    if _plain_value(index):
        return index
    return repr(index)


def _plain_value(v) -> bool:
    if v is None or isinstance(v, (bool, int, float, str, bytes)):
        return True
    if type(v) is tuple:
        return all(_plain_value(x) for x in v)
    return False


def jsonable(index):
    """`index` as a JSON value: numbers, strings and None as themselves, the rest by repr."""
    return index if isinstance(index, (int, float, str, bool)) or index is None else repr(index)
