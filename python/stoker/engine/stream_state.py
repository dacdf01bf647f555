"""The state of a stateful stream (torchdata's ``Stateful`` protocol), and of stateful samplers.

An object is stateful when it has ``state_dict()`` callable with no arguments and
``load_state_dict(state)`` callable with one: the protocol, checked by signature, not by the
names alone. Mosaic's ``StreamingDataset.state_dict(num_samples, from_beginning)`` is another
protocol and runs as torch runs it.

A stateful IterableDataset, or the iterator its ``__iter__`` returns, is asked for its state
after every batch a worker produces; the worker sends it just before the batch. The main process
keeps, per worker, the state that goes with the last batch the user received from that worker,
and a checkpoint carries those. On resume each worker puts its own state back (the dataset's
before ``iter()``, the iterator's after) and continues where the saved run's worker was. A state
is plain data (``_plain``): what ``state_dict()`` returns is converted (NumPy to Python numbers
and tensors) or refused, naming the type, when it is taken, so a checkpoint never holds an
object that loading would have to build. With it travels the worker's position in its stream
(items drawn), which ``seed="per_sample"`` seeds from.

``capture``/``restore_*`` run by the thread that loads the samples (in a worker, or in the main
process with ``num_workers=0``).
"""

from __future__ import annotations

import inspect

from .._plain import to_plain


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
    needs = _required_positional(sd)
    return (needs is None or needs == 0) and _accepts_one(ld)


def capture(dataset, iterator, position: int | None = None) -> dict | None:
    """The states of the dataset and of its iterator (those that are stateful), as plain data,
    with the stream `position`; None when neither is stateful. TypeError (naming the type)
    for a state that is not plain data."""
    state = {}
    if stateful(dataset):
        state["dataset"] = to_plain(dataset.state_dict(),
                                    "the IterableDataset's state_dict()")
    if iterator is not None and iterator is not dataset and stateful(iterator):
        state["iterator"] = to_plain(iterator.state_dict(),
                                     "the state_dict() of the iterator its __iter__ returned")
    if not state:
        return None
    if position is not None:
        state["position"] = position
    return state


def restore_dataset(dataset, state: dict | None) -> None:
    """Before ``iter(dataset)``."""
    if state is not None and "dataset" in state:
        dataset.load_state_dict(state["dataset"])


def restore_iterator(iterator, state: dict | None) -> None:
    """After ``iter(dataset)``."""
    if state is not None and "iterator" in state:
        iterator.load_state_dict(state["iterator"])


def position_of(state: dict | None) -> int:
    """Items the restored stream had drawn (0 for a fresh one)."""
    if state is None:
        return 0
    pos = state.get("position", 0)
    return pos if isinstance(pos, int) and not isinstance(pos, bool) and pos >= 0 else 0
