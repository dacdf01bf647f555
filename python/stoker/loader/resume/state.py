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
  one starts from them); without a generator, ``next_torch_rng`` (torch's global RNG then) and
  ``next_base_seed`` (a persistent iterator's, which its workers keep) do that;
- ``seed``, ``skipped``, ``quarantined``, ``distributed`` (a DistributedSampler's rank and world);
- the workers' states: ``worker_states`` ((worker, state) pairs: a dataset's or stream's own
  state, the worker's generators, whether its stream ended; ``wire/stream_state.py``),
  ``last_worker`` (the worker of the last batch received) and ``workers`` (the num_workers
  they were taken with: only the same number restores them);
- stateful samplers: ``sampler_states`` ({path: state} as the epoch began) and
  ``sampler_states_now`` (when the state was taken);
- ``rebatch``: an epoch resumed under another batch size: the positions its sampler's order
  (or this rank's share of ``order``) had delivered before (``layout.py``); ``position`` then
  counts batches of the saving loader's size over the rest;
- ``delivered_all``: whether the epoch had delivered every batch (True when ``finished``, and
  for a state saved inside the loop after the last batch; None when the loader could not
  tell). Informative: ``DataLoader.delivered_all(state)`` reads it, of older states too.

Every value is plain data (``common.plain``: ints, strings, tuples, dicts, and whatever plain data a
dataset's own state holds): ``torch.save`` with ``torch.load(weights_only=True)`` and
``torch.distributed.checkpoint`` take it, and loading one runs no code. Since version 3 the
document is JSON too: its buffers (``torch_rng``, ``order``, ``generators``,
``generators_now``) are base64 text in it (bytes in ``State``), and its digest does not change
when JSON turns tuples into lists and int keys into strings. ``from_dict`` refuses
what is not a state (a missing or unknown key, another version); ``validate.py`` checks every
field against the loader it is loaded into.

Version 4 added ``rebatch`` and ``delivered_all``; a version-3 state loads with neither (no
layer; ``delivered_all`` worked out from its position and fingerprint). Version 2 keeps
streams' and samplers' states as plain data, its buffers as bytes (still read). A version-1
state (stoker 0.1) pickled each stream's state: it is read with an unpickler that builds
nothing but plain values (``common.plain.loads_plain``), so a crafted one is refused before any
of it runs.

Pure values and functions; any thread.
"""

from __future__ import annotations

import dataclasses
import pickle
from dataclasses import dataclass, field

from torch.utils.data import DataLoader, IterableDataset

from ...common.errors import StateMismatchError
from ...common.plain import b64decode, b64encode, digest, loads_plain
from . import order

VERSION = 4
READS = (1, 2, 3, 4)  # the versions this release loads
# The fields that are buffers: bytes in a State, base64 text in a version-3 document.
_BUFFER = ("torch_rng", "order", "next_torch_rng")
_BUFFERS = ("generators", "generators_now")
_SINCE_3 = ("workers", "next_torch_rng", "next_base_seed")  # (None in an older state)
_SINCE_4 = ("rebatch", "delivered_all")
_SINCE = {3: _SINCE_3, 4: _SINCE_4}  # version -> the fields it added


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
    workers: int | None = None  # the num_workers worker_states were taken with
    sampler_states: dict = field(default_factory=dict)  # path -> state, as the epoch began
    sampler_states_now: dict = field(default_factory=dict)
    # A state taken between epochs, without a loader generator: torch's global RNG then (the
    # next epoch's base seed and shuffle draw from it) and a persistent iterator's base seed
    # (its workers keep it).
    next_torch_rng: bytes | None = None
    next_base_seed: int | None = None
    # An epoch resumed under another batch size: {"prefix": p, "also": (...)}, the positions
    # of its base sequence delivered before (layout.py). None: its batches are the sampler's.
    rebatch: dict | None = None
    delivered_all: bool | None = None  # every batch of the epoch delivered (None: unknown)

    # The fields that say where an epoch is (what a loaded state resumes, and a resumed one
    # reports until it is iterated); the rest describe the loader and its records.
    POSITION = ("epoch", "finished", "position", "delivered_after", "batches_yielded",
                "base_seed", "torch_rng", "generators", "sampler_epoch", "order",
                "worker_states", "last_worker", "workers", "sampler_states", "rebatch")

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    def to_dict(self) -> dict:
        out = {"version": VERSION, **{k: getattr(self, k) for k in self.keys()}}
        for k in _BUFFER:
            out[k] = b64encode(out[k])
        for k in _BUFFERS:
            out[k] = tuple(b64encode(g) for g in out[k])
        out["digest"] = digest({k: out[k] for k in self.keys()}, str_keys=True)
        return out

    @classmethod
    def from_dict(cls, sd) -> State:
        """The state in `sd` (what ``state_dict()`` returned); ``StateMismatchError`` for what
        is not one. Nothing in it is run or unpickled but a version-1 stream state, read as
        plain values only."""
        check_version(sd)
        version = sd["version"]
        if version == 1:
            sd = _from_version_1(sd)
        elif version >= 3:
            sd = _from_json_form(sd)
        for since, added in _SINCE.items():
            if version >= since:
                continue
            later = [k for k in added if k in sd]
            if later:  # a later state relabelled: its digest would not cover them
                raise StateMismatchError(
                    f"stoker: this state says version {version} but has {', '.join(later)}, "
                    f"which only version {since} and later have: it was edited or made by "
                    "another tool. Nothing was loaded.")
            sd = {**sd, **dict.fromkeys(added)}
        if version < 4:
            sd["delivered_all"] = _delivered_all_before_4(sd)
        keys = cls.keys()
        missing = [k for k in keys if k not in sd]
        if missing:
            raise StateMismatchError(
                f"stoker: this state lacks {', '.join(missing)}: it was not made by "
                "stoker.DataLoader.state_dict() of this release, or it was edited or truncated.")
        unknown = sorted(str(k) for k in sd if k not in keys and k not in ("version", "digest"))
        if unknown:
            raise StateMismatchError(
                f"stoker: this state has fields this stoker does not know ({', '.join(unknown)}):"
                " it was made by another tool or release, or edited.")
        return cls(**{k: sd[k] for k in keys})

    def replace(self, **changes) -> State:
        return dataclasses.replace(self, **changes)

    def position_part(self) -> dict:
        return {k: getattr(self, k) for k in self.POSITION}


def _delivered_all_before_4(sd: dict) -> bool | None:
    """A state saved before ``delivered_all`` existed: whether its epoch had delivered every
    batch, as its own fields say (its position against the saved loader's batches per epoch;
    None when they cannot say: a stream, an elastically resumed epoch)."""
    if sd.get("finished") is True:
        return True
    fp = sd.get("loader")
    batches = fp.get("batches_per_epoch") if isinstance(fp, dict) else None
    position = sd.get("position")
    if (sd.get("order") is not None or isinstance(batches, bool) or not isinstance(batches, int)
            or isinstance(position, bool) or not isinstance(position, int)):
        return None
    return position >= batches


def _from_json_form(sd: dict) -> dict:
    """A version-3 document as a State's fields: buffers back to bytes, JSON's lists back to
    the tuples stoker keeps (a dataset's own state is left as the document has it, as
    torchdata leaves it)."""
    out = dict(sd)
    try:
        for k in _BUFFER:
            if k in out:
                out[k] = b64decode(out[k])
        for k in _BUFFERS:
            if k in out and isinstance(out[k], (list, tuple)):
                out[k] = tuple(b64decode(g) for g in out[k])
    except (ValueError, TypeError) as e:
        raise StateMismatchError(
            f"stoker: this state's {k} is not the base64 text state_dict() wrote ({e}): the "
            "checkpoint was edited, truncated or made by another tool. Nothing was loaded.") \
            from None
    for k in ("delivered_after", "skipped", "quarantined"):
        if isinstance(out.get(k), list):
            out[k] = _tuples(out[k])
    if isinstance(out.get("worker_states"), list):
        out["worker_states"] = tuple(tuple(p) if isinstance(p, list) else p
                                     for p in out["worker_states"])
    if isinstance(out.get("loader"), dict):
        out["loader"] = {k: _tuples(v) for k, v in out["loader"].items()}
    if isinstance(out.get("rebatch"), dict):
        out["rebatch"] = {k: _tuples(v) for k, v in out["rebatch"].items()}
    return out


def _tuples(v):
    """JSON's lists as tuples, all the way down (indices, fingerprints)."""
    if isinstance(v, (list, tuple)):
        return tuple(_tuples(x) for x in v)
    return v


def check_digest(sd: dict) -> None:
    """A state since version 2 carries a digest of its fields (``state_dict()`` made it): a
    state whose fields were changed afterwards (a hand edit, a truncated or corrupted file, a
    value that is in range but not the one saved) is refused. Version 1 had none."""
    if sd["version"] < 2:
        return
    saved = sd.get("digest")
    if not isinstance(saved, str):
        raise StateMismatchError(
            f"stoker: this state's digest is {saved!r}; expected the digest state_dict() wrote "
            "(a hex string). The checkpoint was edited, truncated or made by another tool: "
            "nothing was loaded.")
    try:
        now = digest({k: sd[k] for k in State.keys()
                      if all(k not in added or sd["version"] >= since
                             for since, added in _SINCE.items())},
                     str_keys=sd["version"] >= 3)
    except TypeError as e:
        raise StateMismatchError(f"stoker: this state holds something that is not plain data "
                                 f"({e}): nothing was loaded.") from None
    if now != saved:
        raise StateMismatchError(
            "stoker: this state is not the one state_dict() made: its fields do not match its "
            "digest (a value was edited, or the file is truncated or corrupted), so resuming "
            "from it could repeat or lose samples. Nothing was loaded (the loader is as it "
            "was). Use the state as loader.state_dict() returned it, or start afresh.")


def check_version(sd) -> None:
    if not isinstance(sd, dict) or "version" not in sd:
        raise StateMismatchError(
            f"stoker: load_state_dict expects a dict made by stoker.DataLoader.state_dict() (or "
            f"a list of them, one per rank of a saved job), got "
            f"{type(sd).__name__}{' without a version' if isinstance(sd, dict) else ''}."
        )
    v = sd["version"]
    if isinstance(v, bool) or v not in READS:
        raise StateMismatchError(
            f"stoker: this state has version {v!r}; this stoker reads versions "
            f"{', '.join(map(str, READS))}. Resume with the stoker release that saved it."
        )


def _from_version_1(sd: dict) -> dict:
    """A stoker 0.1 state in today's form: each stream state was a pickle (of plain data when
    stoker made it); it is read as plain values only, and a pickle that holds anything else
    is refused before any of it is built."""
    later = sorted(k for k in ("digest", "sampler_states", "sampler_states_now") if k in sd)
    if later:  # a later state relabelled as version 1 would skip the digest's check
        raise StateMismatchError(
            f"stoker: this state says version 1 but has {', '.join(later)}, which version 1 "
            "never had: it was edited or made by another tool. Nothing was loaded.")
    out = {k: v for k, v in sd.items() if k != "version"}
    states = []
    for pair in sd.get("worker_states") or ():
        try:
            w, raw = pair
        except (TypeError, ValueError):
            raise StateMismatchError(
                f"stoker: worker_states holds {pair!r}; expected (worker id, state) pairs") \
                from None
        if isinstance(raw, (bytes, bytearray)):
            try:
                raw = loads_plain(bytes(raw))
            except (pickle.UnpicklingError, EOFError, ValueError, TypeError,
                    AttributeError, IndexError) as e:
                raise StateMismatchError(
                    f"stoker: worker {w}'s stream state in this version-1 state cannot be "
                    f"loaded safely: {e}. A checkpoint is data: it may not name classes or "
                    "functions. Resume with stoker 0.1, or start the epoch afresh.") from None
        elif raw is not None:
            raise StateMismatchError(
                f"stoker: worker {w}'s stream state in this version-1 state is "
                f"{type(raw).__name__}; version 1 saved each one as bytes (or None). Nothing "
                "was loaded.")
        states.append((w, raw))
    out["worker_states"] = tuple(states)
    # (the first 0.1 builds saved neither an explicit order nor stream states)
    out.setdefault("order", None)
    out.setdefault("last_worker", None)
    out.setdefault("sampler_states", {})
    out.setdefault("sampler_states_now", {})
    return out


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
    try:  # (torch's count: a resumed epoch's len(loader) is its own, rebatch.length)
        batches = None if iterable else DataLoader.__len__(loader)
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


def check_fingerprint(saved: dict, here: dict, elastic: bool = False,
                      rebatched: dict | None = None, note: str | None = None) -> None:
    """Refuses a state whose loader orders its samples otherwise than `here`. `rebatched`: the
    fingerprint this loader would have with the saved batch size, when the rest of the epoch
    may be re-batched (rebatch.py): the state must match that one. `note`: why the batch size
    may not change, added to a refusal."""
    # Resized (elastic): each rank has another share of the epoch, so another number of batches.
    ignore = ("batches_per_epoch",) if elastic else ()
    like = rebatched or here
    if all(_tuples(saved.get(k)) == _tuples(like.get(k)) for k in here if k not in ignore):
        return
    differ = [(k, f"{k}: saved {saved.get(k)!r}, here {here.get(k)!r}")
              for k in here if k not in ignore and _tuples(saved.get(k)) != _tuples(here.get(k))]
    diffs = [d for _, d in differ]
    if "num_workers" in (k for k, _ in differ):
        diffs.append("(an IterableDataset is iterated by each worker on its own, so its batches "
                     "depend on num_workers, and a stateful one's state is saved per worker, "
                     "each worker resuming its own state: resume it with the num_workers it "
                     "was saved with)")
    if rebatched is not None and _tuples(saved.get("batches_per_epoch")) != _tuples(
            rebatched.get("batches_per_epoch")):
        diffs.append(f"(with the saved batch_size this loader would make "
                     f"{rebatched.get('batches_per_epoch')!r} batches an epoch: its sampler "
                     "yields another number of samples than the saved loader's)")
    if note:
        diffs.append(note)
    raise StateMismatchError(
        "stoker: this state was saved by a loader that orders its samples differently, so "
        "resuming from it would repeat or lose samples. What differs:\n  - "
        + "\n  - ".join(diffs)
        + "\nBuild the loader as the saved run did (dataset, batch_size, drop_last, sampler, "
        "generator), or start afresh without load_state_dict."
    )


def check_distributed(saved: dict | None, here: dict | None) -> None:
    """One rank's state on the same rank of a job of the same size (a list of states resizes:
    elastic.py)."""
    if (saved is None) != (here is None):
        raise StateMismatchError(
            "stoker: this state was saved by a loader " + (
                "without a DistributedSampler, and this one has one" if saved is None else
                f"whose DistributedSampler was rank {saved['rank']} of "
                f"{saved['num_replicas']}, and this one has none") +
            ": the rest of the epoch would be another set of samples. Build the sampler as the "
            "saved job did.")
    if saved is None:
        return
    if saved["num_replicas"] != here["num_replicas"]:
        raise StateMismatchError(
            f"stoker: this state was saved by rank {saved['rank']} of {saved['num_replicas']} "
            f"ranks; this loader's DistributedSampler has {here['num_replicas']}. One rank's "
            "state cannot say what the other ranks delivered: pass the states of all ranks of "
            "the saved job, as a list, to load_state_dict (every rank loads the same list), "
            "and stoker splits the rest of the epoch among the new ranks."
        )
    diffs = [f"{k}: saved {saved[k]!r}, here {here[k]!r}"
             for k in ("rank", "seed", "shuffle", "drop_last") if saved[k] != here[k]]
    if diffs:
        raise StateMismatchError(
            "stoker: this rank's state comes from another rank or another DistributedSampler ("
            + "; ".join(diffs) + "): resuming from it would deliver another rank's samples. Load "
            "each rank's own state, or pass the list of all ranks' states.")


def _qualname(obj) -> str:
    t = type(obj)
    return f"{t.__module__}.{t.__qualname__}"
