"""Kept so that loaders pickled by stoker 0.1 unpickle (their skip records name this module);
nothing imports it."""

from .config.records import SkippedSample  # noqa: F401
