"""Loading samples with torch's fetch semantics and the user's error policy.

``on_error="raise"`` is torch's behaviour. ``"skip"`` drops a sample whose ``__getitem__`` raised
and records it (the batch comes out smaller; a batch left empty is dropped). ``"retry"`` tries a
failing sample again, up to ``max_retries`` times, then raises.

Used in workers and, with ``num_workers=0``, in the main process; a ``Fetcher`` belongs to the
thread that loads with it.
"""

from __future__ import annotations

from ..config.load import LoadSettings
from ..wire.protocol import safe_str
from . import inflight

MAP, ITERABLE = 0, 1


class AllSkipped(Exception):
    """Every sample of a batch was skipped: there is nothing to send."""


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {safe_str(exc)}"


def _awaited(getitems, fl):
    """`getitems` whose coroutine is awaited on `fl`'s event loop."""
    return lambda idx: inflight.resolve(getitems(idx), fl)


class Fetcher:
    """Fetches one task's samples. ``skipped`` collects (index, reason) of the last fetch;
    ``current`` is the index being loaded (for error reports); ``on_sample(index, position,
    stream_pos)`` is called as each sample starts (the worker writes it to its status page,
    per-sample seeding seeds for it). An IterableDataset's samples have no index: ``stream_pos``
    counts the items drawn from the stream (from `stream_pos` on, after a restored state)."""

    def __init__(self, kind, dataset, auto_collation, drop_last, settings: LoadSettings,
                 on_sample=None, stream_pos: int = 0, on_batch=None, carried=None):
        """`settings`: the error policy and ``threads`` (an int or "auto"): a map-style batch's samples
        load at once (inflight.py), and an async dataset's coroutines are awaited; then
        `on_sample(index, position, None)` is called from the loading threads, and
        `on_batch(index, in_flight)` from this thread before them and as each is done (with
        how many load at once now), `on_batch(None, 0)` once they are; `carried`: the ``inflight.InFlight``
        of this worker's fetcher of the epoch before (its event loop, its threads and what
        "auto" learnt live as long as the worker: an async client made on the loop keeps
        working)."""
        self.kind = kind
        self.inflight = None
        if kind == MAP:  # an earlier epoch's (its loop, its threads, what "auto" learnt) or new
            self.inflight = carried if carried is not None else inflight.InFlight(dataset,
                                                                                  settings)
        self.on_batch = on_batch
        self.serial = False  # the next batch loads one sample at a time (see InFlight.map)
        # samples of a batch are loading at once now: no one of them is "the" sample loading
        self.at_once = False
        self.dataset = dataset
        self.auto_collation = auto_collation
        self.drop_last = drop_last
        self.settings = settings
        self.on_sample = on_sample
        self.current = None
        self.skipped: list[tuple[object, str]] = []
        if kind == ITERABLE:
            self.iterator = iter(dataset)
            self.ended = False
            self.stream_pos = stream_pos

    def _begin(self, index, position=None):
        """`position`: where `index` is in the task's list of indices (0 for a task that is
        one index), so the main process can name a sample whose index is not an int."""
        self.current = index
        if self.on_sample is not None:
            self.on_sample(index, position, None)

    def _next_item(self):
        """The stream's next item, announced with its place in the stream."""
        if self.on_sample is not None:
            self.on_sample(None, None, self.stream_pos)
        self.stream_pos += 1
        return next(self.iterator)

    def _one(self, load, index):
        """load() under the error policy; returns (ok, sample)."""
        attempts = 0
        failure = None
        while True:
            try:
                return True, load()
            except StopIteration:
                if failure is not None:  # a generator ends after it raised: the error stands
                    raise failure from None
                raise
            except Exception as e:
                if self.settings.on_error == "retry" and attempts < self.settings.max_retries:
                    attempts += 1
                    failure = e
                    continue
                if self.settings.on_error == "skip":
                    self.skipped.append((index, _reason(e)))
                    return False, None
                raise

    def fetch(self, index, task=None, lookahead=None):
        """The samples of `index` (task number `task`), under the policy. `lookahead()`: see
        ``inflight.InFlight.map`` (the worker starts its next task's samples with
        ``start_ahead`` while this one's last ones load)."""
        self.skipped = []
        if self.kind == MAP:
            return self._fetch_map(index, task, lookahead)
        return self._fetch_iterable(index)

    def loads_at_once(self, index) -> bool:
        """Whether `index`'s samples load at once on threads, so that a next task's may start
        ahead (``start_ahead``): a map-style batch of several, no __getitems__, not async."""
        fl = self.inflight
        return (self.kind == MAP and self.auto_collation and fl is not None
                and not fl.is_async and fl.width.now > 1 and isinstance(index, list)
                and len(index) > 1 and getattr(self.dataset, "__getitems__", None) is None)

    def start_ahead(self, task, index) -> None:
        """Starts loading task `task`'s samples (``loads_at_once(index)``) on the threads left
        free; its ``fetch`` takes them up."""
        self.inflight.start_ahead(task, self._load, list(enumerate(index)))

    def _load(self, item):
        """One sample of a batch loading at once (on a loading thread): (position, index)."""
        pos, i = item
        if self.on_sample is not None:
            self.on_sample(i, pos, None)
        return self.dataset[i]

    def _fetch_map(self, index, task=None, lookahead=None):
        ds = self.dataset
        fl = self.inflight
        if not self.auto_collation:
            self._begin(index, 0)
            ok, sample = self._one(lambda: inflight.resolve(ds[index], fl), index)
            if not ok:
                raise AllSkipped()
            return sample
        getitems = getattr(ds, "__getitems__", None)
        if getitems:
            self._begin(index)
            if fl.is_async:  # an async def __getitems__: each call awaited on the worker's loop
                getitems = _awaited(getitems, fl)
            if self.settings.on_error == "raise":
                return getitems(index)
            try:
                return getitems(index)
            except Exception:
                pass  # find the culprit sample by sample, under the policy
            data = []
            for pos, i in enumerate(index):
                self._begin(i, pos)
                ok, sample = self._one(lambda i=i: getitems([i])[0], i)
                if ok:
                    data.append(sample)
        elif fl.concurrent and (len(index) > 1 or fl.is_async):
            data = self._fetch_at_once(index, task, lookahead)
        else:
            data = []
            for pos, i in enumerate(index):
                self._begin(i, pos)
                ok, sample = self._one(lambda i=i: ds[i], i)
                if ok:
                    data.append(sample)
        self.current = index
        if not data:
            raise AllSkipped()
        return data

    def _fetch_at_once(self, index, task=None, lookahead=None):
        """A batch's samples loaded at once (threads or coroutines), then each outcome under the
        policy in sampler order: the first failure (in that order) is the one raised, a retry
        loads that sample again on its own, a skip is recorded in order."""
        fl = self.inflight
        serial, self.serial = self.serial, False
        load = self._load
        progress = None
        if self.on_batch is not None:
            def progress(in_flight):
                self.on_batch(index, 0 if serial else in_flight)
        # (one at a time, the status page names each sample: a death then names its own)
        self.at_once = not serial and min(fl.width.now, len(index)) > 1
        try:
            outcomes = fl.map(load, list(enumerate(index)), serial=serial, progress=progress,
                              key=task, lookahead=None if serial else lookahead)
        finally:
            self.at_once = False
            if self.on_batch is not None:
                self.on_batch(None, 0)
        data = []
        for (pos, i), (ok, sample, error) in zip(enumerate(index), outcomes):
            if not ok:
                self.current = i
                if isinstance(error, StopIteration):
                    raise error  # as _one: not an error of the sample, the policy does not apply
                ok, sample = self._after_failure(error, lambda item=(pos, i): self._again(load, item),
                                                 i)
            if ok:
                data.append(sample)
        return data

    def _again(self, load, item):
        ok, value, error = self.inflight.map(load, [item], serial=True)[0]
        if not ok:
            raise error
        return value

    def _after_failure(self, error, load, index):
        """What the policy makes of a sample whose first attempt raised `error`: (ok, sample);
        `load()` tries it again."""
        if self.settings.on_error == "retry" and self.settings.max_retries > 0:
            attempts, failure = 1, error
            while True:
                try:
                    return True, load()
                except Exception as e:
                    failure = e
                    if attempts >= self.settings.max_retries:
                        break
                    attempts += 1
            error = failure
        if self.settings.on_error == "skip":
            self.skipped.append((index, _reason(error)))
            return False, None
        raise error

    def close(self) -> None:
        """Ends what loads samples at once (its threads, its event loop)."""
        if self.inflight is not None:
            self.inflight.close()

    def _fetch_iterable(self, index):
        if self.ended:
            raise StopIteration
        self.current = None
        if not self.auto_collation:
            ok, sample = self._one(self._next_item, None)
            if not ok:
                raise AllSkipped()
            return sample
        data = []
        for _ in index:
            try:
                ok, sample = self._one(self._next_item, None)
            except StopIteration:
                self.ended = True
                break
            if ok:
                data.append(sample)
        if not data and not self.ended:
            raise AllSkipped()  # every sample of this batch was skipped
        if not data or (self.drop_last and self.ended and len(data) < len(index)):
            raise StopIteration
        return data
