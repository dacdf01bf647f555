"""The state of a stateful IterableDataset in a worker (torchdata's ``Stateful`` protocol).

A dataset, or the iterator its ``__iter__`` returns, that has ``state_dict()`` and
``load_state_dict(state)`` is asked for its state after every batch the worker produces; the
worker sends it (pickled) just before the batch. The main process keeps, per worker, the state
that goes with the last batch the user received from that worker, and a checkpoint carries
those. On resume each worker puts its own state back (the dataset's before ``iter()``, the
iterator's after) and continues where the saved run's worker was, instead of loading again and
dropping the batches already received.

``capture``/``restore`` run in workers (and in the main process with ``num_workers=0``), by the
thread that loads the samples.
"""

from __future__ import annotations

import pickle


def stateful(obj) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None))


def capture(dataset, iterator) -> bytes | None:
    """The pickled states of the dataset and of its iterator (those that are stateful)."""
    state = {}
    if stateful(dataset):
        state["dataset"] = dataset.state_dict()
    if iterator is not None and iterator is not dataset and stateful(iterator):
        state["iterator"] = iterator.state_dict()
    return pickle.dumps(state) if state else None


def restore_dataset(dataset, payload: bytes | None) -> None:
    """Before ``iter(dataset)``."""
    if payload is not None:
        state = pickle.loads(payload)
        if "dataset" in state:
            dataset.load_state_dict(state["dataset"])


def restore_iterator(iterator, payload: bytes | None) -> None:
    """After ``iter(dataset)``."""
    if payload is not None:
        state = pickle.loads(payload)
        if "iterator" in state:
            iterator.load_state_dict(state["iterator"])
