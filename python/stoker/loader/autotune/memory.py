"""What autotune decided, kept per dataset for the next loader of this process.

A framework often builds a new DataLoader over the same dataset each epoch (a validation loader
re-created by its hooks, a loader per evaluation): each would start from half the CPUs again.
The tuner's last snapshot is kept here under the dataset object (by a weak reference: a dataset
that goes is forgotten, and an object reusing its ``id`` is not taken for it) and the loader's
fingerprint (the bound, the batch size, its own prefetch_factor, what is tuned); a controller
without an earlier iterator of its own loader starts from it when the fingerprint is the same.

Thread contract: any thread (one lock).
"""

from __future__ import annotations

import threading
import weakref

KEEP = 64  # datasets remembered at most (the oldest go first)

_lock = threading.Lock()
_kept: dict[int, tuple] = {}  # id(dataset) -> (weak reference, fingerprint, snapshot)


def recall(dataset, fingerprint: tuple) -> dict | None:
    """The snapshot left by the latest loader of `dataset` with this `fingerprint` in this
    process, or None."""
    with _lock:
        entry = _kept.get(id(dataset))
        if entry is None or entry[0]() is not dataset or entry[1] != fingerprint:
            return None
        return entry[2]


def keep(dataset, fingerprint: tuple, snapshot: dict) -> None:
    """Remembers `snapshot` for the next loader of `dataset` (nothing for a dataset that takes
    no weak reference: its id alone could name another object later)."""
    try:
        ref = weakref.ref(dataset)
    except TypeError:
        return
    key = id(dataset)
    with _lock:
        _kept.pop(key, None)
        _kept[key] = (ref, fingerprint, snapshot)
        for k in [k for k, (r, _, _) in _kept.items() if r() is None]:
            del _kept[k]
        while len(_kept) > KEEP:
            del _kept[next(iter(_kept))]
