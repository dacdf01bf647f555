"""Kept so that loaders pickled by stoker 0.1 unpickle (``_legacy.py``); nothing imports it."""

from ._legacy import LoaderState  # noqa: F401
