"""Kept so that loaders pickled by stoker 0.1 unpickle (their death records name this module);
nothing imports it."""

from .engine.deaths import Death  # noqa: F401
