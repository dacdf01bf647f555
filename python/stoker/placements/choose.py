"""The placement an iterator's workers get, from its ``placement`` option.

Called by the iterator as it starts (the thread that iterates).
"""

from __future__ import annotations

import warnings

from ..config.placement import Node
from .local import LocalProcesses


def workers_for(placement, ctx, num_workers: int, loader_token: int, stream: bool = False):
    """Local processes for ``placement=None``; for a ``config.placement.Node``, the node's pool
    (a `stream`'s workers stay the rank's own: an IterableDataset's workers each read their own
    part of it); for a ``config.placement.Ray``, actors on its cluster, with its first
    ``local_workers`` ids as local processes. (Each worker's share of ``max_shared_memory``
    comes with its config and ``set_memory_share``, whatever runs it.)"""
    if placement is None:
        return LocalProcesses(ctx, num_workers, loader_token)
    if isinstance(placement, Node):
        if stream:
            return LocalProcesses(ctx, num_workers, loader_token)
        from .node import NodeWorkers
        from .node.wire import PeerRefused

        try:
            return NodeWorkers(placement, num_workers)
        except PeerRefused as e:
            warnings.warn(f"stoker: the node pool's name is held by another user's process "
                          f"({e}); this loader uses workers of its own instead.",
                          RuntimeWarning, stacklevel=4)
            return LocalProcesses(ctx, num_workers, loader_token)
    from .ray import RayWorkers

    split = min(placement.local_workers, num_workers)
    remote = RayWorkers(placement, num_workers, range(split, num_workers))
    if split == 0:
        return remote
    from .mixed import Mixed

    if ctx.get_start_method() == "fork":
        # Ray's driver runs gRPC threads: a forked child could inherit a lock one of them holds
        import multiprocessing

        ctx = multiprocessing.get_context("forkserver")
    return Mixed(LocalProcesses(ctx, num_workers, loader_token), remote, split)
