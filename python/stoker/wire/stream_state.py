"""The state of a stateful stream (torchdata's ``Stateful`` protocol), and of stateful samplers.

An object is stateful when it has ``state_dict()`` callable with no arguments and
``load_state_dict(state)`` callable with one: the protocol, checked by signature, not by the
names alone. Mosaic's ``StreamingDataset.state_dict(num_samples, from_beginning)`` is another
protocol and runs as torch runs it.

A worker's state is taken after every batch it produces and sent just before the batch: the
states of a stateful dataset (map-style or iterable) and of a stream's iterator, the worker's
position in its stream (items drawn, which ``seed="per_sample"`` seeds from), whether the stream
ended, and, under torch's default seeding, the worker's global generators (``rng_state``), so
that augmentation drawn in workers resumes as the uninterrupted run drew it. The main process
keeps, per worker, the state that goes with the last batch the user received from that worker,
and a checkpoint carries those. On resume each worker puts its own state back, in torchdata's
order: the dataset's before ``iter()``, the iterator's after (a dataset that is its own iterator
too), the generators last; and continues where the saved run's worker was. A state is plain
data (``common.plain``): what ``state_dict()`` returns is converted (NumPy to Python numbers and
tensors) or refused, naming the type, when it is taken, so a checkpoint never holds an object
that loading would have to build.

``capture``/``restore_*`` run by the thread that loads the samples (in a worker, or in the main
process with ``num_workers=0``).
"""

from __future__ import annotations

import inspect

from ..common import rng_state
from ..common.plain import to_plain


def _required_positional(fn) -> int | None:
    """How many arguments `fn` needs (None when it cannot be told)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    return sum(1 for p in sig.parameters.values()
               if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


def _accepts_one(fn) -> bool:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return True
    try:
        sig.bind(None)
        return True
    except TypeError:
        return False


def stateful(obj) -> bool:
    """The ``Stateful`` protocol: ``state_dict()`` with no arguments and
    ``load_state_dict(state)``."""
    sd = getattr(obj, "state_dict", None)
    ld = getattr(obj, "load_state_dict", None)
    if not (callable(sd) and callable(ld)):
        return False
    # Asked after every batch: the answer is kept per pair of functions (inspecting their
    # signatures takes 20 us).
    key = (getattr(sd, "__func__", sd), getattr(ld, "__func__", ld))
    try:
        return _PROTOCOL[key]
    except (KeyError, TypeError):
        pass
    needs = _required_positional(sd)
    ok = (needs is None or needs == 0) and _accepts_one(ld)
    try:
        if len(_PROTOCOL) < 256:
            _PROTOCOL[key] = ok
    except TypeError:  # an unhashable callable
        pass
    return ok


_PROTOCOL: dict = {}  # (state_dict, load_state_dict) functions -> whether they are the protocol


def capture(dataset, iterator, position: int | None = None, rng=None,
            ended: bool = False) -> dict | None:
    """A worker's state after its last batch, as plain data (None when there is nothing to
    keep): the dataset's own state (``"dataset"``), its iterator's (``"iterator"``; ``"self"``
    when the dataset is its own iterator: restored after ``iter()``, as torchdata does), the
    stream `position`, the global generators (``"rng"``, raw, taken by the
    ``rng_state.Tracker`` `rng`, when given) and whether the stream `ended`. TypeError (naming the type) for a state that is not
    plain data."""
    state: dict = {}
    if iterator is not None and iterator is dataset:
        if stateful(dataset):
            state["self"] = to_plain(dataset.state_dict(),
                                     "the state_dict() of the IterableDataset (its own iterator)")
    else:
        if stateful(dataset):
            state["dataset"] = to_plain(dataset.state_dict(), "the dataset's state_dict()")
        if iterator is not None and stateful(iterator):
            state["iterator"] = to_plain(iterator.state_dict(),
                                         "the state_dict() of the iterator its __iter__ returned")
    if rng is not None:
        state["rng"] = rng.capture()
    if not state:
        return None
    if position is not None:
        state["position"] = position
    if ended:
        state["ended"] = True
    return state


def plain(state: dict | None) -> dict | None:
    """`state` as a checkpoint holds it (the generators' raw state made JSON-safe)."""
    if state is None or not isinstance(state.get("rng"), tuple):
        return state
    return {**state, "rng": rng_state.plain(state["rng"])}


def ended(state: dict | None) -> bool:
    return bool(state) and state.get("ended") is True


def into_next_epoch(states: dict) -> dict:
    """worker -> state, as workers that live on (persistent ones, num_workers=0's dataset)
    begin the next epoch with it: the dataset's own state (a stream that is its own iterator
    is one then) and the generators; the stream's position and end belong to the last."""
    out = {}
    for w, st in states.items():
        keep = {k: st[k] for k in ("dataset", "rng") if k in st}
        if "self" in st:
            keep["dataset"] = st["self"]
        if keep:
            out[w] = keep
    return out


def restore_dataset(dataset, state: dict | None) -> None:
    """Before ``iter(dataset)`` (or, for a map-style dataset, before its first sample). A stream
    that is its own iterator and had ended puts its state back here: the next ``iter()`` starts
    its next epoch from it (an epoch counter carries on)."""
    if state is None:
        return
    if "dataset" in state:
        dataset.load_state_dict(state["dataset"])
    elif "self" in state and ended(state):
        dataset.load_state_dict(state["self"])


def restore_iterator(dataset, iterator, state: dict | None) -> None:
    """After ``iter(dataset)``: the iterator's state (the dataset's, when it is its own
    iterator), unless its stream had ended (the new epoch starts it afresh)."""
    if state is None or ended(state):
        return
    if "iterator" in state:
        iterator.load_state_dict(state["iterator"])
    elif "self" in state and iterator is dataset:
        dataset.load_state_dict(state["self"])


def restore_rng(state: dict | None) -> None:
    """Last (after worker_init_fn, the dataset's and the iterator's states): the generators as
    they were after the batch the state goes with."""
    if state is not None and state.get("rng") is not None:
        rng = state["rng"]
        rng_state.restore(rng_state.plain(rng) if isinstance(rng, tuple) else rng)


def is_stream_state(state: dict | None) -> bool:
    """The state positions a stream (its dataset's or its iterator's own state)."""
    return bool(state) and any(k in state for k in ("dataset", "iterator", "self"))


def position_of(state: dict | None) -> int:
    """Items the restored stream had drawn (0 for a fresh one)."""
    if state is None:
        return 0
    pos = state.get("position", 0)
    return pos if isinstance(pos, int) and not isinstance(pos, bool) and pos >= 0 else 0
