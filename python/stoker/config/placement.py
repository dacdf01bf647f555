"""Where workers run, as an option: ``placement=None`` (local processes, the default),
``stoker.Node(...)`` (one pool of workers per machine serving every rank of a job) or
``stoker.Ray(...)`` (actors on a Ray cluster, some of them local processes).

``Node`` and ``Ray`` are plain, frozen descriptions: they import nothing, pickle, and travel as
JSON to the children of ``stoker run`` and ``enable()``. ``placements/`` makes workers from them.

Immutable values: any thread.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class Ray:
    """Workers as Ray actors on the cluster at `address` (as ``ray.init`` takes it; None: the
    cluster this process is connected to, or a new local one), each asking for
    `cpus_per_worker` CPUs, spread over the cluster's nodes. The first `local_workers` worker
    ids stay local processes of this machine (its spare cores first). A replacement actor that
    finds no room within `start_timeout_s` hands its work to the other workers, and joins when
    the cluster has room again."""

    address: str | None = None
    cpus_per_worker: float = 1.0
    local_workers: int = 0
    start_timeout_s: float = 20.0

    def __post_init__(self):
        if self.address is not None and not isinstance(self.address, str):
            raise ValueError(f"Ray(address=...) must be None or a str, got {self.address!r}")
        if isinstance(self.cpus_per_worker, bool) or not isinstance(
                self.cpus_per_worker, (int, float)) or self.cpus_per_worker <= 0:
            raise ValueError(f"Ray(cpus_per_worker=...) must be > 0, got {self.cpus_per_worker!r}")
        if isinstance(self.local_workers, bool) or not isinstance(self.local_workers, int) \
                or self.local_workers < 0:
            raise ValueError(f"Ray(local_workers=...) must be an int >= 0, got "
                             f"{self.local_workers!r}")
        if isinstance(self.start_timeout_s, bool) or not isinstance(
                self.start_timeout_s, (int, float)) or self.start_timeout_s <= 0:
            raise ValueError(f"Ray(start_timeout_s=...) must be > 0 seconds, got "
                             f"{self.start_timeout_s!r}")

    def to_dict(self) -> dict:
        return {"kind": "ray", **dataclasses.asdict(self)}

    def describe(self) -> str:
        where = self.address or "the connected (or a new local) cluster"
        local = f", {self.local_workers} local" if self.local_workers else ""
        return f"Ray actors on {where} ({self.cpus_per_worker:g} CPU each{local})"


@dataclass(frozen=True)
class Node:
    """Every loader of this job on this machine served by one pool of `workers` worker processes
    ("auto": the CPUs this job may use, less one for each rank's own loop). The job is
    ``TORCHELASTIC_RUN_ID`` (torchrun), else ``MASTER_ADDR:MASTER_PORT``, else `name`; a pool
    serves only processes of its own user. docs/design/node.md has the whole picture."""

    workers: int | str = "auto"
    name: str | None = None

    def __post_init__(self):
        w = self.workers
        if w != "auto" and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
            raise ValueError(f"Node(workers=...) must be \"auto\" or an int >= 1, got {w!r}")
        if self.name is not None and (not isinstance(self.name, str) or not self.name):
            raise ValueError(f"Node(name=...) must be None or a non-empty str, got "
                             f"{self.name!r}")

    def to_dict(self) -> dict:
        return {"kind": "node", **dataclasses.asdict(self)}

    def describe(self) -> str:
        return f"the node's worker pool ({self.workers} workers)"


def normalize(value, address: str | None = None):
    """A placement from what a user, a flag or JSON gives: None/"local" (local processes),
    a ``Node`` or "node", a ``Ray``, "ray" (a Ray at `address`), or ``to_dict()``'s form.
    ValueError otherwise."""
    if value is None or value == "local":
        return None
    if isinstance(value, Node):
        return value
    if value == "node":
        return Node()
    if isinstance(value, dict) and value.get("kind") == "node":
        return Node(**{k: v for k, v in value.items() if k != "kind"})
    if isinstance(value, Ray):
        return value if value.address or not address else dataclasses.replace(value,
                                                                             address=address)
    if value == "ray":
        return Ray(address=address)
    if isinstance(value, dict) and value.get("kind") == "ray":
        fields = {k: v for k, v in value.items() if k != "kind"}
        return Ray(**fields)
    raise ValueError(f"placement must be None (local processes), 'local', 'node', "
                     f"stoker.Node(...), 'ray' or stoker.Ray(...), got {value!r}")
