"""torch's collate semantics, in Python, for what the C++ fast path declines.

The fast path (C++) handles the common types and stacks straight into shared memory. For anything
else (custom Mapping or Sequence types, mixed number types, object arrays...) the worker runs
torch's own ``collate`` here, so results and errors are exactly torch's. The one change: tensors
are stacked with plain ``torch.stack``, never into a new /dev/shm segment as torch does inside a
worker; the result is copied into the slot anyway.

Runs where collate runs: a worker's loading thread (or the main process with
``num_workers=0``).
"""

from __future__ import annotations

from ..common.torch_compat import collate_module


def _stack(batch, *, collate_fn_map=None):
    import torch

    elem = batch[0]
    if elem.is_nested or elem.layout != torch.strided:
        # Let torch raise its own message for nested and sparse tensors.
        return collate_module().collate_tensor_fn(batch, collate_fn_map=collate_fn_map)
    return torch.stack(batch, 0)


def collate_in_python(batch):
    import torch

    c = collate_module()
    fn_map = dict(c.default_collate_fn_map)
    fn_map[torch.Tensor] = _stack
    return c.collate(batch, collate_fn_map=fn_map)


def convert_in_python(data):
    from torch.utils.data import default_convert

    return default_convert(data)


def stop_collate_from_using_shm() -> None:
    """In a worker: make torch's default_collate (if a user's collate_fn calls it) stack without
    creating a shared-memory segment per batch in /dev/shm."""
    import torch

    collate_module().default_collate_fn_map[torch.Tensor] = _stack
