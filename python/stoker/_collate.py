"""torch's collate semantics, in Python, for what the C++ fast path declines.

The fast path (C++) handles the common types and stacks straight into shared memory. For anything
else (custom Mapping or Sequence types, mixed number types, object arrays...) the worker runs
torch's own ``collate`` here, so results and errors are exactly torch's. The one change: tensors
are stacked with plain ``torch.stack``, never into a new /dev/shm segment as torch does inside a
worker; the result is copied into the slot anyway.
"""

from __future__ import annotations


def _stack(batch, *, collate_fn_map=None):
    import torch

    elem = batch[0]
    if elem.is_nested or elem.layout != torch.strided:
        # Let torch raise its own message for nested and sparse tensors.
        from torch.utils.data._utils.collate import collate_tensor_fn

        return collate_tensor_fn(batch, collate_fn_map=collate_fn_map)
    return torch.stack(batch, 0)


def collate_in_python(batch):
    from torch.utils.data._utils.collate import collate, default_collate_fn_map

    fn_map = dict(default_collate_fn_map)
    import torch

    fn_map[torch.Tensor] = _stack
    return collate(batch, collate_fn_map=fn_map)


def convert_in_python(data):
    from torch.utils.data._utils.collate import default_convert

    return default_convert(data)


def stop_collate_from_using_shm() -> None:
    """In a worker: make torch's default_collate (if a user's collate_fn calls it) stack without
    creating a shared-memory segment per batch in /dev/shm."""
    import torch
    from torch.utils.data._utils import collate as torch_collate

    torch_collate.default_collate_fn_map[torch.Tensor] = _stack
