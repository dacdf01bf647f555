"""What a loader remembers across iterators and epochs: epochs, skipped samples, deaths,
quarantine, and a weak reference to its live iterator (for ``stats()``).

It pickles and copies like the loader that holds it: a copy keeps the records and drops the
iterator reference (a live iterator's workers belong to the process and loader that started them).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from ._fetch import SkippedSample


@dataclass
class LoaderState:
    epoch: int = 0
    skipped: list = field(default_factory=list)      # SkippedSample records
    deaths: list = field(default_factory=list)       # _deaths.Death records
    death_counts: dict = field(default_factory=dict)  # dataset index -> deaths while loading it
    quarantined: set = field(default_factory=set)
    iterator: object = None  # weakref to the latest multi-process iterator
    logged: set = field(default_factory=set)  # indices whose skip was logged already
    # Who served the latest multi-process iterator: "stoker.DataLoader", "stoker.enable()", or
    # None (torch's own iterator, or none yet). stats() and the first iterator's log line say it.
    served_by: str | None = None
    # num_workers="auto": the tuner's latest state (stats() after the epoch; the next iterator
    # starts from its count of active workers).
    autotune: dict | None = None

    def record_skip(self, rec: SkippedSample) -> None:
        """Keeps the record; logs each index once, however many epochs skip it."""
        from ._recovery import key, log

        self.skipped.append(rec)
        if key(rec.index) not in self.logged:
            self.logged.add(key(rec.index))
            log.warning("stoker: skipped dataset index %r: %s", rec.index, rec.reason)

    def live_iterator(self):
        it = self.iterator() if self.iterator is not None else None
        return it if it is not None and not it._shutdown else None

    def __getstate__(self):
        d = dict(self.__dict__)
        d["iterator"] = None
        return d

    def __setstate__(self, d):
        self.__dict__.update(d)

    def copy(self) -> LoaderState:
        """An independent copy of the records, without the live iterator."""
        return copy.deepcopy(self)


def stats_of(loader) -> dict:
    """``stats()`` for any loader stoker has served (see ``DataLoader.stats``)."""
    from ._options import state_of

    st = state_of(loader)
    it = st.live_iterator()
    live = it.stats() if it is not None else {
        "workers": [], "batches_yielded": 0, "seconds_waiting_for_data": 0.0,
        "data_stall": 0.0, "memory": {}}
    if "autotune" not in live and st.autotune is not None:
        live["autotune"] = st.autotune
    live.update({
        "loader": f"{type(loader).__module__}.{type(loader).__qualname__}",
        "served_by": st.served_by,
        "epoch": st.epoch,
        "num_workers": loader.num_workers,
        "deaths": [{"worker_id": d.worker_id, "pid": d.pid, "signal": d.signal,
                    "exit_code": d.exit_code, "cause": d.cause, "index": _jsonable(d.index),
                    "epoch": d.epoch} for d in st.deaths],
        "skipped": [{"index": _jsonable(s.index), "reason": s.reason, "epoch": s.epoch}
                    for s in st.skipped],
        "quarantined": sorted((_jsonable(q) for q in st.quarantined), key=repr),
    })
    return live


def _jsonable(x):
    return x if isinstance(x, (int, float, str, bool)) or x is None else repr(x)
