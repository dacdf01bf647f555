"""The placement an iterator's workers get, from its ``placement`` option.

Called by the iterator as it starts (the thread that iterates).
"""

from __future__ import annotations

from .local import LocalProcesses


def workers_for(placement, ctx, num_workers: int, loader_token: int):
    """Local processes for ``placement=None``; for a ``config.placement.Ray``, actors on its
    cluster, with its first ``local_workers`` ids as local processes. (Each worker's share of
    ``max_shared_memory`` comes with its config and ``set_memory_share``, whatever runs it.)"""
    if placement is None:
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
