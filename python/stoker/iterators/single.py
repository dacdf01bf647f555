"""``num_workers=0``: torch's own one-process iterator, with the error policy (``on_error="skip"``
or ``"retry"``), per-sample seeding, and the position a checkpoint records.

Thread contract: the thread that iterates (as torch's).
"""

from __future__ import annotations

from torch.utils.data import IterableDataset

from .. import _torch_compat
from ..config import seeding
from ..config.records import SkippedSample, records_of
from ..engine import stream_state
from ..engine.fetch import ITERABLE, MAP, AllSkipped, Fetcher
from ..resume.cursor import Cursor


class PolicyFetcher:
    """torch's in-process fetcher, with the error policy applied sample by sample and, under
    seed="per_sample", each sample's generators seeded before it is loaded."""

    def __init__(self, loader, options, records, seeder=None):
        kind = ITERABLE if isinstance(loader.dataset, IterableDataset) else MAP
        self.fetcher = Fetcher(kind, loader.dataset, loader._auto_collation, loader.drop_last,
                               options.on_error, options.max_retries, seeder)
        self.collate_fn = loader.collate_fn
        self.records = records
        self.seeding = seeder is not None

    def fetch(self, index):
        if not self.seeding:
            return self._fetch(index)
        with seeding.KeptGenerators():  # collate draws as in a worker: after the last sample
            return self._fetch(index)

    def _fetch(self, index):
        try:
            data = self.fetcher.fetch(index)
        finally:
            for i, reason in self.fetcher.skipped:
                self.records.record_skip(SkippedSample(i, reason, self.records.epoch))
        return self.collate_fn(data)


class SingleProcessIter(_torch_compat.single_process_iterator()):
    def __init__(self, loader, options):
        self._records = records_of(loader)
        self._options = options
        self._cursor = Cursor(loader, self._records)
        self._cursor.prepare_epoch()  # torch's __init__ makes the epoch's sampler iterator
        with self._cursor.drawing_base_seed():
            super().__init__(loader)
        self._base_seed = self._cursor.base_seed(self._base_seed)
        self._seeder = seeding.seeder_for(options, self._base_seed, 0)
        if options.on_error != "raise" or self._seeder is not None:
            self._dataset_fetcher = PolicyFetcher(loader, options, self._records, self._seeder)
        self._discard = 0
        self._begin_epoch()

    def _begin_epoch(self):
        start = self._cursor.begin_epoch(self._sampler_iter, self._base_seed)
        self._sampler_iter, self._base_seed = start.sampler_iter, start.base_seed
        self._discard = start.discard
        if self._seeder is not None:
            self._seeder.begin_epoch(self._records.epoch, self._base_seed)
        mine = start.stream_states.get(0)
        if mine is not None:  # a resumed stateful IterableDataset
            stream_state.restore_dataset(self._dataset, mine)
            fresh = iter(self._dataset)
            stream_state.restore_iterator(fresh, mine)
            self._set_stream(fresh, stream_state.position_of(mine))

    def _stream(self):
        """(the IterableDataset's live iterator, the items drawn from it: None when torch's own
        fetcher does not count them)."""
        f = self._dataset_fetcher
        if isinstance(f, PolicyFetcher):
            return f.fetcher.iterator, f.fetcher.stream_pos
        return _torch_compat.fetcher_iterator(f), None

    def _set_stream(self, it, position: int) -> None:
        f = self._dataset_fetcher
        if isinstance(f, PolicyFetcher):
            f.fetcher.iterator = it
            f.fetcher.stream_pos = position
        else:
            _torch_compat.set_fetcher_iterator(f, it)

    def _reset(self, loader, first_iter=False):
        self._cursor.prepare_epoch()
        super()._reset(loader, first_iter)
        self._begin_epoch()

    def __next__(self):
        if self._cursor.pending():  # load_state_dict after this iterator began
            self._reset(self._cursor.loader)
        while self._discard > 0:  # IterableDataset: batches received before the resume
            self._discard -= 1
            super().__next__()
        return super().__next__()

    def _next_data(self):
        while True:
            try:
                data = super()._next_data()
            except AllSkipped:
                self._delivered()
                continue
            except StopIteration:
                self._cursor.finished()
                raise
            except Exception:
                self._delivered()  # the user got this batch's error
                raise
            self._delivered()
            return data

    def _delivered(self) -> None:
        self._cursor.delivered_here()
        if isinstance(self._dataset, IterableDataset):  # what a resume continues from
            self._cursor.stream_state_here(stream_state.capture(self._dataset, *self._stream()))
