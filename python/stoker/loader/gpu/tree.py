"""The tensors of a batch, walked as torch's ``pin_memory`` walks them.

``map_tensors(batch, fn)`` rebuilds `batch` with ``fn(t)`` in place of every tensor, through the
containers torch's pin_memory goes through (mappings, namedtuples, tuples, sequences), keeping
their types as torch does; strings, bytes and anything else pass unchanged. An object with its
own ``pin_memory()`` method is handed to `custom` (None: unchanged), as torch's pin_memory calls
that method.

Pure functions: safe from any thread.
"""

from __future__ import annotations

import collections.abc
import copy


def map_tensors(data, fn, custom=None):
    import torch

    return _walk(data, fn, custom, torch.Tensor)


def _walk(data, fn, custom, tensor_type):
    if isinstance(data, tensor_type):
        return fn(data)
    if isinstance(data, (str, bytes)):
        return data
    if custom is not None and hasattr(data, "pin_memory"):
        return custom(data)
    if isinstance(data, collections.abc.Mapping):
        items = {k: _walk(v, fn, custom, tensor_type) for k, v in data.items()}
        try:
            if isinstance(data, collections.abc.MutableMapping):
                clone = copy.copy(data)
                clone.update(items)
                return clone
            return type(data)(items)
        except TypeError:
            return items
    if isinstance(data, tuple):
        if hasattr(data, "_fields"):  # namedtuple
            return type(data)(*(_walk(v, fn, custom, tensor_type) for v in data))
        return type(data)(_walk(v, fn, custom, tensor_type) for v in data)
    if isinstance(data, collections.abc.Sequence):
        items = [_walk(v, fn, custom, tensor_type) for v in data]
        try:
            if isinstance(data, collections.abc.MutableSequence):
                clone = copy.copy(data)
                for i, v in enumerate(items):
                    clone[i] = v
                return clone
            return type(data)(items)
        except TypeError:
            return items
    return data
