"""When what the loader records about a batch happens: as the batch reaches the user.

The position a checkpoint saves, skipped samples and the end of the epoch are recorded when an
outcome is handed out. Without a device stage that is when the iterator pulls it; with one
(``loader/gpu/device.py``) the stage pulls a batch ahead, so the work rides with the next batch pulled
and runs as the stage hands it out. Batches dropped after a resume (a stream read again) were
handed out before the checkpoint: their work runs at once and records no skips (``replaying``).

Thread contract: the thread that iterates.
"""

from __future__ import annotations


class Handout:
    def __init__(self, stage):
        self._stage = stage
        self.replaying = False  # dropping batches delivered before a resume

    def later(self, fn, *args) -> None:
        """Runs `fn(*args)` as the outcome being pulled reaches the user."""
        if self._stage is not None and not self.replaying:
            self._stage.defer(fn, *args)
        else:
            fn(*args)

    def replayed(self, fn, *args) -> None:
        """Runs `fn(*args)` at once for an outcome delivered before the resume (loaded again
        and dropped)."""
        self.replaying = True
        try:
            fn(*args)
        finally:
            self.replaying = False
