"""The classes a loader pickled by stoker 0.1 names, kept so that it still unpickles.

stoker 0.1 kept a loader's records in ``stoker._state.LoaderState`` and its resume tracker in
``stoker._checkpoint.Tracker`` (holding an ``EpochRecord``). Unpickling such a loader builds these
plain holders, and ``config.records.records_of`` folds them into today's one side-car the first
time the loader is used. Nothing else refers to them. A leaf: imports nothing.
"""


class LoaderState:
    """stoker 0.1's ``stoker._state.LoaderState`` (its attributes come from the pickle)."""


class Tracker:
    """stoker 0.1's ``stoker._checkpoint.Tracker``: ``current`` (an EpochRecord) and
    ``pending`` (a dict)."""


class EpochRecord:
    """stoker 0.1's ``stoker._checkpoint.EpochRecord``."""
