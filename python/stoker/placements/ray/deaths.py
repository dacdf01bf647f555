"""Naming an actor's death, from Ray's error and what is known of its node: lost with its node,
killed by Ray's memory monitor, or its process ended (a segfault, a kill). A hang is named in
the words every placement uses (``common.deaths.describe_hang``). Pure functions; any thread.
"""

from __future__ import annotations

from ...common import deaths as _deaths


def name_death(error, info: dict, hung=None) -> tuple[str, str]:
    """(short cause, explanation with what to do) of an actor's death: `error` is what Ray
    raised (``RayActorError`` and kin), `info` what the actor said of itself when it was ready
    (``node``; ``node_lost`` when its node left the cluster), `hung` the ``Hung`` it was killed
    for."""
    where = f"on node {info['node']}" if info.get("node") else "on the cluster"
    if hung is not None:
        return _deaths.describe_hang(hung.seconds, hung.stack, index=hung.index,
                                     stuck=hung.stuck, where=f"(Ray actor {where}) ")
    text = str(error)
    low = text.lower()
    if info.get("node_lost") or "node has died" in low or "node died" in low:
        cause = f"was lost with its node ({info.get('node', 'a node')} left the cluster)"
        what = ("a node that leaves the cluster (stopped, preempted, out of reach) takes its "
                "actors with it; stoker re-issues their batches")
    elif "memory monitor" in low or "running low on memory" in low \
            or type(error).__name__ == "OutOfMemoryError":
        cause = f"was killed by Ray's memory monitor (out of memory {where})"
        what = ("the node ran out of memory: lower batch_size or prefetch_factor, make samples "
                "smaller, or give the actors more memory")
    else:
        cause = f"died: its process {where} ended unexpectedly"
        what = ("a crash in native code (SIGSEGV in a decoder), the OOM killer or a kill from "
                "outside; Ray's log of the actor (the driver's output, prefixed with its pid) "
                "has its last lines")
    detail = "\n".join(text.strip().splitlines()[:12])
    return cause, f"(Ray actor {where}) {cause}.\nRay says: {detail}\nWhat to do: {what}."


def start_failed(error) -> bool:
    """Whether the actor's creation itself failed, so that a new one would fail the same way:
    its constructor raised (unpickling the dataset, ``worker_init_fn``: Ray says so with
    ``actor_init_failed``, "an error raised in its creation task"), or its runtime environment
    could not be set up. An actor process killed or lost while it started may start again."""
    if getattr(error, "actor_init_failed", False):
        return True
    if type(error).__name__ == "RuntimeEnvSetupError":  # its environment cannot be made
        return True
    return "error raised in its creation task" in str(error)
