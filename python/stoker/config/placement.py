"""Where workers run, as an option: ``placement=None`` (local processes, the default) or
``stoker.Ray(...)`` (actors on a Ray cluster, some of them local processes).

``Ray`` is a plain, frozen description: it imports nothing of Ray, pickles, and travels as JSON
to the children of ``stoker run`` and ``enable()``. ``placements/`` makes workers from it.

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


def normalize(value, address: str | None = None):
    """A placement from what a user, a flag or JSON gives: None/"local" (local processes), a
    ``Ray``, "ray" (a Ray at `address`), or ``Ray.to_dict()``'s form. ValueError otherwise."""
    if value is None or value == "local":
        return None
    if isinstance(value, Ray):
        return value if value.address or not address else dataclasses.replace(value,
                                                                             address=address)
    if value == "ray":
        return Ray(address=address)
    if isinstance(value, dict) and value.get("kind") == "ray":
        fields = {k: v for k, v in value.items() if k != "kind"}
        return Ray(**fields)
    raise ValueError(f"placement must be None (local processes), 'local', 'ray' or "
                     f"stoker.Ray(...), got {value!r}")
