"""Every class a loader pickled by stoker 0.1 names, under the name it names it by.

stoker 0.1 kept a loader's records in ``stoker._state.LoaderState`` and its resume tracker in
``stoker._checkpoint.Tracker`` (holding an ``EpochRecord``): those three have no counterpart
today, so they are plain holders here, built by unpickling (their attributes come from the
pickle), and ``config.records.records_of`` folds them into today's one side-car the first time
the loader is used (``resume.position.point_of`` reads the tracker). The skip records
(``stoker._fetch.SkippedSample``) and death records (``stoker._deaths.Death``) are today's
classes, whose fields are 0.1's. ``stoker._compat`` makes the four old module names lead here.

Thread contract: classes only; nothing here runs but their construction by the unpickler.
"""

from ..common.deaths import Death
from ..config.records import SkippedSample

__all__ = ["Death", "EpochRecord", "LoaderState", "SkippedSample", "Tracker"]


class LoaderState:
    """stoker 0.1's ``stoker._state.LoaderState`` (its attributes come from the pickle)."""


class Tracker:
    """stoker 0.1's ``stoker._checkpoint.Tracker``: ``current`` (an EpochRecord) and
    ``pending`` (a dict)."""


class EpochRecord:
    """stoker 0.1's ``stoker._checkpoint.EpochRecord``."""
