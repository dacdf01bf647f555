"""Loading samples with torch's fetch semantics and the user's error policy.

Two fetchers, as torch has ``_MapDatasetFetcher`` and ``_IterableDatasetFetcher``:
``MapFetcher`` loads a map-style dataset's indices (on threads, ``inflight.py``), and
``StreamFetcher`` draws an ``IterableDataset``'s items from its iterator. Both put every sample
through one rule, ``attempt`` (``LoadSettings``: ``on_error`` and ``max_retries``):

- ``"raise"`` is torch's behaviour: the sample's exception is the task's outcome;
- ``"skip"`` drops the sample and records it (the batch comes out smaller; a batch left empty is
  dropped, ``AllSkipped``);
- ``"retry"`` loads it again, up to ``max_retries`` more times, then raises the last failure.

``StopIteration``, as torch reads it: from a stream's ``next()`` it is the stream's end, not an
error (the policy does not apply); but when ``next()`` raises it while a failing item is retried,
the stream ended behind the failure, and the failure stands (it is raised: a retry that could
not load the item again is a failed retry, never a silent end with the error dropped). From a
map-style dataset's ``__getitem__`` (or ``__getitems__``) it is an ordinary error, retried,
skipped or raised like any other (torch's worker reports it as the sample's error too).

Used in workers and, with ``num_workers=0``, in the main process; a fetcher belongs to the
thread that loads with it.
"""

from __future__ import annotations

from ..config.load import LoadSettings
from ..wire.protocol import safe_str
from . import inflight
from .inflight import InFlight

MAP, ITERABLE = 0, 1


class AllSkipped(Exception):
    """Every sample of a batch was skipped: there is nothing to send."""


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {safe_str(exc)}"


def attempt(load, settings: LoadSettings, failed: Exception | None = None,
            stream: bool = False) -> tuple[bool, object]:
    """`load()` under the error policy: ``(True, sample)``, or ``(False, error)`` for a sample
    ``on_error="skip"`` drops; raises the error otherwise. `failed`: the error of a first
    attempt made elsewhere (a batch's samples loaded at once), so that only the retries are
    left. `stream`: `load` draws a stream's next item, so a StopIteration from a first attempt
    is its end (raised as it is) and from a retry leaves the failure standing (module doc)."""
    failure = failed
    attempts = 0 if failed is None else 1
    while failure is None or attempts <= settings.retries:
        attempts += 1
        try:
            return True, load()
        except StopIteration as e:
            if stream:
                if failure is None:
                    raise
                break  # the stream ended behind the failure: the failure stands
            failure = e
        except Exception as e:
            failure = e
    if settings.on_error == "skip":
        return False, failure
    raise failure


class Loading:
    """One task's samples being loaded (``begin``). Iterating it yields, as each of its
    samples loading at once on threads is done, how many places at the worker's gate it leaves
    free: the worker loop decides whether to start its next task's samples there
    (``MapFetcher.start_ahead``). ``result()`` waits for the rest and applies the policy: the
    task's samples, or it raises (``AllSkipped``, the error, StopIteration at a stream's end).
    `at_once`: its samples load at once now (no one of them is "the" sample loading: the
    status page names none); False once they are done (a retry then loads on its own)."""

    def __init__(self, finish, batch: inflight.Batch | None = None, at_once: bool = False):
        self._finish = finish
        self._batch = batch
        self.at_once = at_once

    def __iter__(self):
        return iter(self._batch) if self._batch is not None else iter(())

    def result(self):
        finish = self._finish
        if finish is None:
            raise RuntimeError("stoker: a task's samples were taken once already")
        # Let go of the closure and the batch once taken: `finish` refers to this Loading, and
        # the cycle would keep the task's samples alive until a full garbage collection (few
        # Python objects, large tensors: it rarely comes; measured +60 MB an epoch on 3.11).
        self._finish = self._batch = None
        return finish()


class _Fetcher:
    """What both fetchers share: the policy's outcome, what it skipped, the sample on.
    ``skipped`` collects (index, reason) of the last task; ``current`` is the index being
    loaded (for error reports); ``on_sample(index, position, stream_pos)`` is called as each
    sample starts (the worker writes it to its status page, per-sample seeding seeds for it)."""

    inflight: inflight.InFlight | None = None

    def __init__(self, dataset, auto_collation: bool, settings: LoadSettings, on_sample=None):
        self.dataset = dataset
        self.auto_collation = auto_collation
        self.settings = settings
        self.on_sample = on_sample
        self.current = None
        self.skipped: list[tuple[object, str]] = []

    def _policy(self, load, index, failed=None, stream=False) -> tuple[bool, object]:
        """``attempt``, a skip recorded with `index`: (ok, sample)."""
        ok, value = attempt(load, self.settings, failed, stream)
        if ok:
            return True, value
        assert isinstance(value, BaseException)  # (attempt's error, for a skipped sample)
        self.skipped.append((index, _reason(value)))
        return False, None

    def begin(self, index, task=None, serial: bool = False) -> Loading:
        raise NotImplementedError

    def skip_all(self, index, reason: str) -> None:
        """Records every sample of `index` (a list, one index, or None for a stream's item)
        skipped for `reason`: what the loop does when a batch whose samples loaded could not
        be collated under ``on_error="skip"`` (a collate failure is never retried: collating
        again gives the same result)."""
        self.current = index
        self.skipped = [(i, reason) for i in (index if isinstance(index, list) else [index])]

    def fetch(self, index, task=None, serial: bool = False):
        """The samples of `index` (task number `task`), under the policy, all at once (no one
        starts anything ahead meanwhile)."""
        return self.begin(index, task, serial).result()

    def close(self) -> None:
        """Ends what loads samples at once (its threads, its event loop)."""
        if self.inflight is not None:
            self.inflight.close()


def _awaited(getitems, fl):
    """`getitems` whose coroutine is awaited on `fl`'s event loop."""
    return lambda idx: inflight.resolve(getitems(idx), fl)


class MapFetcher(_Fetcher):
    """A map-style dataset's samples by index: a batch's at once on threads (or an async
    dataset's coroutines), one by one otherwise; ``__getitems__`` as torch calls it."""

    inflight: InFlight  # (always one: made or carried in __init__)

    def __init__(self, dataset, auto_collation: bool, settings: LoadSettings, on_sample=None,
                 on_batch=None, carried: InFlight | None = None, on_running=None):
        """`on_sample(index, position, None)` is also called from the loading threads;
        `on_batch(index, in_flight)` from this thread before a batch loading at once and as
        each of its samples is done (with how many load at once now), `on_batch(None, 0)` once
        they are (`in_flight` None where `on_running` counts them); `carried`: the ``InFlight`` of this worker's fetcher of the epoch before (its
        event loop, its threads and what "auto" learnt live as long as the worker: an async
        client made on the loop keeps working). `on_running(n)`: how many samples load on the
        threads now, as it changes (``Gate.report_running``: those of a batch started ahead
        too); where it is given, `on_batch`'s `in_flight` is None for a batch on the threads
        (only an async dataset's coroutines are counted by it)."""
        super().__init__(dataset, auto_collation, settings, on_sample)
        self.inflight = carried if carried is not None else inflight.InFlight(dataset, settings)
        self.on_batch = on_batch
        self._threads_count = on_running is not None and not self.inflight.is_async
        if on_running is not None:
            self.inflight.report_running(on_running)

    def _begin(self, index, position=None):
        """`position`: where `index` is in the task's list of indices (0 for a task that is
        one index), so the main process can name a sample whose index is not an int."""
        self.current = index
        if self.on_sample is not None:
            self.on_sample(index, position, None)

    def loads_at_once(self, index) -> bool:
        """Whether `index`'s samples load at once on threads, so that a next task's may start
        ahead (``start_ahead``): a map-style batch of several, no __getitems__, not async."""
        fl = self.inflight
        return (self.auto_collation and not fl.is_async and fl.width.now > 1
                and isinstance(index, list) and len(index) > 1
                and getattr(self.dataset, "__getitems__", None) is None)

    def start_ahead(self, task, index) -> None:
        """Starts loading task `task`'s samples (``loads_at_once(index)``) on the threads left
        free; its ``begin`` takes them up."""
        self.inflight.start_ahead(task, self._load, list(enumerate(index)))

    def _load(self, item):
        """One sample of a batch loading at once (on a loading thread): (position, index)."""
        pos, i = item
        if self.on_sample is not None:
            self.on_sample(i, pos, None)
        return self.dataset[i]

    def begin(self, index, task=None, serial: bool = False) -> Loading:
        """`serial`: a batch's samples load one at a time whatever the width (a task
        re-issued after its worker died with several in flight: the status page names each,
        so a death names its own)."""
        self.skipped = []
        fl = self.inflight
        if (self.auto_collation and getattr(self.dataset, "__getitems__", None) is None
                and fl.concurrent and (len(index) > 1 or fl.is_async)):
            return self._begin_at_once(index, task, serial)
        return Loading(lambda: self._fetch(index))

    def _done(self, index, data):
        self.current = index
        if not data:
            raise AllSkipped()
        return data

    def _fetch(self, index):
        ds = self.dataset
        fl = self.inflight
        if not self.auto_collation:
            self._begin(index, 0)
            ok, sample = self._policy(lambda: inflight.resolve(ds[index], fl), index)
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
                ok, sample = self._policy(lambda i=i: getitems([i])[0], i)
                if ok:
                    data.append(sample)
            return self._done(index, data)
        data = []
        for pos, i in enumerate(index):
            self._begin(i, pos)
            ok, sample = self._policy(lambda i=i: ds[i], i)
            if ok:
                data.append(sample)
        return self._done(index, data)

    def _begin_at_once(self, index, task, serial) -> Loading:
        """A batch's samples loaded at once (threads or coroutines), then each outcome under the
        policy in sampler order: the first failure (in that order) is the one raised, a retry
        loads that sample again on its own, a skip is recorded in order. While they load,
        `current` is the batch's index (an error starting them names this batch, not the one
        before)."""
        fl = self.inflight
        self.current = index
        progress = None
        if self.on_batch is not None:
            def progress(in_flight):
                self.on_batch(index, None if self._threads_count else
                              0 if serial else in_flight)
        items = list(enumerate(index))
        try:
            batch = fl.start(self._load, items, serial=serial, progress=progress, key=task)
        except BaseException:
            if self.on_batch is not None:
                self.on_batch(None, None if self._threads_count else 0)
            raise

        def finish():
            try:
                outcomes = batch.outcomes()
            finally:
                loading.at_once = False
                if self.on_batch is not None:
                    self.on_batch(None, None if self._threads_count else 0)
            data = []
            for item, (ok, sample, error) in zip(items, outcomes):
                if not ok:
                    self.current = item[1]
                    ok, sample = self._policy(lambda item=item: self._again(item), item[1],
                                              failed=error)
                if ok:
                    data.append(sample)
            return self._done(index, data)

        # (one at a time, the status page names each sample: a death then names its own)
        loading = Loading(finish, batch, at_once=not serial and min(fl.width.now, len(index)) > 1)
        return loading

    def _again(self, item):
        ok, value, error = self.inflight.map(self._load, [item], serial=True)[0]
        if not ok:
            raise error
        return value


class StreamFetcher(_Fetcher):
    """An IterableDataset's items, drawn one after the other from its iterator. Its samples
    have no index: ``stream_pos`` counts the items drawn (from `stream_pos` on, after a
    restored state); ``ended`` once the iterator raised StopIteration."""

    def __init__(self, dataset, auto_collation: bool, drop_last: bool, settings: LoadSettings,
                 on_sample=None, stream_pos: int = 0):
        super().__init__(dataset, auto_collation, settings, on_sample)
        self.drop_last = drop_last
        self.iterator = iter(dataset)
        self.ended = False
        self.stream_pos = stream_pos

    def _next_item(self):
        """The stream's next item, announced with its place in the stream."""
        if self.on_sample is not None:
            self.on_sample(None, None, self.stream_pos)
        self.stream_pos += 1
        try:
            return next(self.iterator)
        except StopIteration:
            self.ended = True  # (also when a retry met it: the failure stands, the stream ended)
            raise

    def begin(self, index, task=None, serial: bool = False) -> Loading:
        self.skipped = []
        return Loading(lambda: self._fetch(index))

    def _fetch(self, index):
        if self.ended:
            raise StopIteration
        self.current = None
        if not self.auto_collation:
            ok, sample = self._policy(self._next_item, None, stream=True)
            if not ok:
                raise AllSkipped()
            return sample
        data = []
        for _ in index:
            try:
                ok, sample = self._policy(self._next_item, None, stream=True)
            except StopIteration:
                break
            if ok:
                data.append(sample)
        if not data and not self.ended:
            raise AllSkipped()  # every sample of this batch was skipped
        if not data or (self.drop_last and self.ended and len(data) < len(index)):
            raise StopIteration
        return data


def fetcher_for(kind: int, dataset, auto_collation: bool, drop_last: bool,
                settings: LoadSettings, on_sample=None, stream_pos: int = 0, on_batch=None,
                carried: inflight.InFlight | None = None,
                on_running=None) -> MapFetcher | StreamFetcher:
    """The fetcher of a dataset of `kind` (MAP or ITERABLE)."""
    if kind == MAP:
        return MapFetcher(dataset, auto_collation, settings, on_sample, on_batch, carried,
                          on_running)
    return StreamFetcher(dataset, auto_collation, drop_last, settings, on_sample, stream_pos)
