"""What a loader remembers across its iterators and epochs: the one side-car on a loader.

``records_of(loader)`` is the loader's ``LoaderRecords``, kept in ``loader.__dict__["_stoker"]``
(torch's ``DataLoader.__setattr__`` guards a few names only; this one is ours), made on first use,
for a ``stoker.DataLoader`` and for a torch loader served by ``stoker.enable()`` alike. It holds:

- the epoch counter (advanced by the resume cursor as an epoch begins, the one place that does),
- the skipped samples, the worker deaths and the quarantined indices,
- who served the latest iterator, and what autotune learnt (the next iterator starts there),
- the resume point (``resume``), which only the resume package reads and writes,
- a weak reference to the live iterator (for ``stats()`` from any thread).

It pickles and copies like the loader that holds it: a copy keeps the records and drops the
iterator reference (a live iterator's workers belong to the process and loader that started them).

Thread contract: written by the thread that iterates the loader; ``live_iterator`` may be called
from any thread.
"""

from __future__ import annotations

import copy
import logging
import weakref
from dataclasses import dataclass, field

from ..common.indices import key

log = logging.getLogger("stoker")

_KEY = "_stoker"
# Side-cars of loaders pickled before the records were one object (stoker 0.1).
_LEGACY_RECORDS, _LEGACY_RESUME = "_stoker_state", "_stoker_resume"


@dataclass
class SkippedSample:
    """A sample the loader dropped: ``index`` (dataset index), ``reason``, ``epoch``."""

    index: object
    reason: str
    epoch: int = 0


@dataclass
class LoaderRecords:
    epoch: int = 0
    skipped: list = field(default_factory=list)  # SkippedSample
    deaths: list = field(default_factory=list)  # common.deaths.Death
    quarantined: set = field(default_factory=set)  # keys (_indices.key) of poison indices
    logged: set = field(default_factory=set)  # keys of indices whose skip was logged already
    # "stoker.DataLoader", "stoker.enable()", or None (torch's own iterator, or none yet).
    served_by: str | None = None
    autotune: dict | None = None  # the tuner's latest snapshot
    resume: object = None  # resume.position.ResumePoint, owned by the resume package
    iterator: object = None  # weakref to the latest multi-process iterator

    def record_skip(self, rec: SkippedSample) -> None:
        """Keeps the record; logs each index once, however many epochs skip it."""
        self.skipped.append(rec)
        k = key(rec.index)
        if k not in self.logged:
            self.logged.add(k)
            log.warning("stoker: skipped dataset index %r: %s", rec.index, rec.reason)

    def set_skipped(self, records) -> None:
        """Replaces the skip records (a loaded checkpoint's); their indices count as logged."""
        self.skipped = list(records)
        self.logged = {key(s.index) for s in self.skipped}

    def set_iterator(self, it) -> None:
        self.iterator = weakref.ref(it)

    def live_iterator(self):
        """The latest multi-process iterator while it runs, else None (any thread)."""
        ref = self.iterator
        it = ref() if ref is not None else None
        return it if it is not None and not it.closed else None

    def __getstate__(self):
        d = dict(self.__dict__)
        d["iterator"] = None
        return d

    def __setstate__(self, d):
        self.__dict__.update(d)

    def copy(self) -> LoaderRecords:
        """An independent copy of the records, without the live iterator."""
        return copy.deepcopy(self)


def records_of(loader) -> LoaderRecords:
    """The loader's records, made on first use (a loader pickled by stoker 0.1 has its two
    side-cars folded into one here)."""
    d = loader.__dict__
    rec = d.get(_KEY)
    if rec is None:
        rec = _from_legacy(d.pop(_LEGACY_RECORDS, None), d.pop(_LEGACY_RESUME, None))
        d[_KEY] = rec
    return rec


def _from_legacy(old, old_resume) -> LoaderRecords:
    rec = LoaderRecords()
    if old is not None:
        o = old.__dict__
        rec.epoch = o.get("epoch", 0)
        rec.skipped = list(o.get("skipped", ()))
        rec.deaths = list(o.get("deaths", ()))
        rec.quarantined = set(o.get("quarantined", ()))
        rec.logged = set(o.get("logged", ()))
        rec.served_by = o.get("served_by")
        rec.autotune = o.get("autotune")
    rec.resume = old_resume  # the resume package reads the old tracker (loader/resume/position.py)
    return rec
