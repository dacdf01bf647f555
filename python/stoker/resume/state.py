"""The checkpoint document: one versioned type, its keys listed once, and its checks.

``State`` is what ``loader.state_dict()`` returns (as a plain dict, ``to_dict``) and what
``load_state_dict`` accepts (``from_dict``). Its fields:

- ``loader``: the fingerprint of the loader that saved it (what decides which indices each
  batch holds); a state resumes only on a loader that agrees (``check_fingerprint``);
- where the epoch is: ``epoch``, ``finished``, ``position`` (sampler positions ``[0, position)``
  delivered), ``delivered_after`` (positions beyond it delivered early with ``in_order=False``),
  ``batches_yielded``;
- what regenerates its order: ``base_seed``, ``torch_rng`` (torch's global RNG at the sampler's
  first draw), ``generators`` (the loader's generators as the epoch began), ``sampler_epoch``,
  ``order`` (an elastically resumed epoch's explicit global order);
- ``generators_now``: the generators when the state was taken (the next epoch after a finished
  one starts from them);
- ``seed``, ``skipped``, ``quarantined``, ``distributed`` (a DistributedSampler's rank and world);
- a stateful IterableDataset: ``worker_states`` ((worker, state) pairs) and ``last_worker``.

Every value is plain data (ints, strings, bytes, tuples, dicts): ``torch.save`` with
``torch.load(weights_only=True)`` and ``torch.distributed.checkpoint`` take it.

Pure values and functions; any thread.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from torch.utils.data import IterableDataset

from .._errors import StateMismatchError
from . import order

VERSION = 1


@dataclass(frozen=True)
class State:
    loader: dict
    epoch: int = 0
    finished: bool = True
    position: int = 0
    delivered_after: tuple = ()
    batches_yielded: int = 0
    base_seed: int = 0
    torch_rng: bytes | None = None
    generators: tuple = ()
    generators_now: tuple = ()
    sampler_epoch: int | None = None
    seed: str | None = None
    skipped: tuple = ()  # (index, reason, epoch)
    quarantined: tuple = ()
    distributed: dict | None = None
    order: bytes | None = None
    worker_states: tuple = ()  # (worker id, state)
    last_worker: int | None = None

    # The fields that say where an epoch is (what a loaded state resumes, and a resumed one
    # reports until it is iterated); the rest describe the loader and its records.
    POSITION = ("epoch", "finished", "position", "delivered_after", "batches_yielded",
                "base_seed", "torch_rng", "generators", "sampler_epoch", "order",
                "worker_states", "last_worker")

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    def to_dict(self) -> dict:
        return {"version": VERSION, **{k: getattr(self, k) for k in self.keys()}}

    @classmethod
    def from_dict(cls, sd) -> State:
        """The state in `sd` (what ``state_dict()`` returned); ``StateMismatchError`` for what
        is not one."""
        check_version(sd)
        missing = [k for k in cls.keys() if k not in sd]
        if missing:
            raise StateMismatchError(
                f"stoker: this state lacks {', '.join(missing)}: it was not made by "
                "stoker.DataLoader.state_dict() of this release, or it was edited or truncated.")
        return cls(**{k: sd[k] for k in cls.keys()})

    def replace(self, **changes) -> State:
        return dataclasses.replace(self, **changes)

    def position_part(self) -> dict:
        return {k: getattr(self, k) for k in self.POSITION}


def check_version(sd) -> None:
    if not isinstance(sd, dict) or "version" not in sd:
        raise StateMismatchError(
            f"stoker: load_state_dict expects a dict made by stoker.DataLoader.state_dict() (or "
            f"a list of them, one per rank of a saved job), got "
            f"{type(sd).__name__}{' without a version' if isinstance(sd, dict) else ''}."
        )
    if sd["version"] != VERSION:
        raise StateMismatchError(
            f"stoker: this state has version {sd['version']!r}; this stoker reads version "
            f"{VERSION}. Resume with the stoker release that saved it."
        )


# -- what must match ------------------------------------------------------------------------------
def fingerprint(loader) -> dict:
    """What decides which indices each batch holds: a state resumes only on a loader that
    agrees on all of it."""
    ds = loader.dataset
    iterable = isinstance(ds, IterableDataset)
    try:
        length = None if iterable else len(ds)
    except TypeError:
        length = None
    try:
        batches = None if iterable else len(loader)
    except TypeError:
        batches = None
    bs = loader.batch_sampler
    return {
        "dataset_kind": "iterable" if iterable else "map",
        "dataset_length": length,
        "batch_size": loader.batch_size,
        "drop_last": loader.drop_last,
        "sampler": _qualname(loader.sampler),
        "batch_sampler": _qualname(bs) if bs is not None else "",
        "batches_per_epoch": batches,
        "generators": tuple(path for path, _ in order.generators(loader)),
        # An IterableDataset is split among workers (each iterates its own copy): another
        # num_workers gives other batches.
        "num_workers": loader.num_workers if iterable else None,
    }


def check_fingerprint(saved: dict, here: dict, elastic: bool = False) -> None:
    # Resized (elastic): each rank has another share of the epoch, so another number of batches.
    ignore = ("batches_per_epoch",) if elastic else ()
    diffs = [f"{k}: saved {saved.get(k)!r}, here {here.get(k)!r}"
             for k in here if k not in ignore and saved.get(k) != here.get(k)]
    if "num_workers" in (d.split(":")[0] for d in diffs):
        diffs.append("(an IterableDataset is iterated by each worker on its own, so its batches "
                     "depend on num_workers, and a stateful one's state is saved per worker, "
                     "each worker resuming its own state: resume it with the num_workers it "
                     "was saved with)")
    if diffs:
        raise StateMismatchError(
            "stoker: this state was saved by a loader that orders its samples differently, so "
            "resuming from it would repeat or lose samples. What differs:\n  - "
            + "\n  - ".join(diffs)
            + "\nBuild the loader as the saved run did (dataset, batch_size, drop_last, sampler, "
            "generator), or start afresh without load_state_dict."
        )


def check_distributed(saved: dict | None, here: dict | None) -> None:
    """One rank's state on a job of the same size (a list of states resizes: elastic.py)."""
    if saved is None or here is None:
        return
    if saved["num_replicas"] != here["num_replicas"]:
        raise StateMismatchError(
            f"stoker: this state was saved by rank {saved['rank']} of {saved['num_replicas']} "
            f"ranks; this loader's DistributedSampler has {here['num_replicas']}. One rank's "
            "state cannot say what the other ranks delivered: pass the states of all ranks of "
            "the saved job, as a list, to load_state_dict (every rank loads the same list), "
            "and stoker splits the rest of the epoch among the new ranks."
        )


def _qualname(obj) -> str:
    t = type(obj)
    return f"{t.__module__}.{t.__qualname__}"
