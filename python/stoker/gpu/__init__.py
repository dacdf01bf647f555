"""The last mile to the GPU: batches that arrive pinned, and batches copied to the device ahead.

An iterator asks ``last_mile()`` for its ``LastMile`` (``last_mile.py``); docs/design/gpu.md has
the rules and the parts. ``stoker.gpu.last_mile`` is that function, not the module of that name
(``importlib.import_module("stoker.gpu.last_mile")`` returns the module).

Thread contract: ``last_mile()`` from the thread that starts an iterator; ``LastMile``'s own.
"""

from .last_mile import LastMile, last_mile

__all__ = ["LastMile", "last_mile"]
