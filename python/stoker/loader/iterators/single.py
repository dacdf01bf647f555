"""``num_workers=0``: torch's own one-process iterator, with the error policy (``on_error="skip"``
or ``"retry"``), per-sample seeding, and the position a checkpoint records.

Thread contract: the thread that iterates (as torch's).
"""

from __future__ import annotations

from torch.utils.data import IterableDataset

from ...common import system as _system
from ...common import torch_compat as _torch_compat
from ...config import seeding
from ...config.load import LoadSettings, is_async
from ...config.records import SkippedSample, records_of
from ...wire import stream_state
from ...worker.fetch import ITERABLE, MAP, AllSkipped, StreamFetcher, fetcher_for
from ..gpu.last_mile import last_mile
from ..resume.cursor import Cursor
from .handout import Handout


class PolicyFetcher:
    """torch's in-process fetcher, with the error policy applied sample by sample and, under
    seed="per_sample", each sample's generators seeded before it is loaded."""

    def __init__(self, loader, settings: LoadSettings, records, seeder=None):
        kind = ITERABLE if isinstance(loader.dataset, IterableDataset) else MAP
        self.fetcher = fetcher_for(kind, loader.dataset, loader._auto_collation,
                                   loader.drop_last, settings, seeder)
        self.collate_fn = loader.collate_fn
        self.records = records
        self.seeding = seeder is not None
        self._skips: list = []  # skipped since take_skips()

    def fetch(self, index):
        if not self.seeding:
            return self._fetch(index)
        with seeding.KeptGenerators():  # collate draws as in a worker: after the last sample
            return self._fetch(index)

    def _fetch(self, index):
        try:
            data = self.fetcher.fetch(index)
        finally:
            self._skips.extend(self.fetcher.skipped)
        return self.collate_fn(data)

    def take_skips(self) -> list:
        """The (index, reason) skipped by the fetches since the last call: recorded when
        their batch reaches the user, not when it is loaded."""
        out, self._skips = self._skips, []
        return out

    def record(self, skips) -> None:
        for i, reason in skips:
            self.records.record_skip(SkippedSample(i, reason, self.records.epoch))


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
        # (made once, as a worker's; its threads may take every CPU this process may use)
        settings = LoadSettings.of(options, loader.dataset, _system.rank_cpus())
        if settings.on_error != "raise" or self._seeder is not None or \
                settings.threads != 1 or is_async(loader.dataset):
            self._dataset_fetcher = PolicyFetcher(loader, settings, self._records, self._seeder)
        self._discard = 0
        # device: batches copied ahead on a side stream (loader/gpu/); torch's iterator pins.
        self._mile = last_mile(False, options.device, self._next_host)
        self._stage = self._mile.stage if self._mile is not None else None
        self._handout = Handout(self._stage)  # when outcomes are recorded
        self._begin_epoch()

    def _begin_epoch(self):
        start = self._cursor.begin_epoch(self._sampler_iter, self._base_seed)
        self._sampler_iter, self._base_seed = start.sampler_iter, start.base_seed
        self._discard = start.discard
        if self._seeder is not None:
            self._seeder.begin_epoch(self._records.epoch, self._base_seed)
        mine = start.stream_states.get(0)
        if mine:  # a resume: the dataset's (and its stream's) own state back
            stream_state.restore_dataset(self._dataset, mine)
            if isinstance(self._dataset, IterableDataset):
                fresh = iter(self._dataset)
                stream_state.restore_iterator(self._dataset, fresh, mine)
                self._set_stream(fresh, stream_state.position_of(mine))
        # A state taken before the first batch resumes the dataset as the epoch began.
        self._cursor.stream_state_here(self._state())

    def _state(self, ended: bool = False):
        """The dataset's (and its stream's) own state now (stream_state.py)."""
        if isinstance(self._dataset, IterableDataset):
            return stream_state.capture(self._dataset, *self._stream(), ended=ended)
        return stream_state.capture(self._dataset, None)

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
            assert isinstance(f.fetcher, StreamFetcher)  # (only a stream has a position)
            f.fetcher.iterator = it
            f.fetcher.stream_pos = position
        else:
            _torch_compat.set_fetcher_iterator(f, it)

    def _reset(self, loader, first_iter=False):
        self._cursor.prepare_epoch()
        super()._reset(loader, first_iter)
        if self._stage is not None:  # batches copied ahead belong to the old epoch
            self._stage.clear()
        self._begin_epoch()

    def __next__(self):
        if self._cursor.pending():  # load_state_dict after this iterator began
            self._reset(self._cursor.loader)
        return super().__next__()

    def _next_data(self):
        if self._stage is not None:
            return self._stage.next()
        return self._next_host()

    def _next_host(self):
        while True:
            try:
                data = super()._next_data()
            except AllSkipped:
                self._drawn()
                continue
            except StopIteration:
                self._handout.later(self._ended, self._state(ended=True))
                raise
            except Exception:
                if self._drawn():  # read again after a resume: the user had this error
                    continue
                raise  # the user gets this batch's error
            if self._drawn():  # read again after a resume: the user had this batch
                continue
            return data

    def _drawn(self) -> bool:
        """The outcome just loaded will reach the user: where it was and the dataset's state
        after it, taken now, recorded when it is handed out. True when the user had it before
        a resume (a stream read again): it is dropped."""
        state = self._state()
        f = self._dataset_fetcher
        skips = f.take_skips() if isinstance(f, PolicyFetcher) else ()
        if self._discard > 0:
            self._discard -= 1
            self._num_yielded += 1
            self._handout.replayed(self._delivered, self._cursor.here(), state, skips)
            return True
        self._handout.later(self._delivered, self._cursor.here(), state, skips)
        return False

    def _ended(self, state) -> None:
        self._cursor.stream_state_here(state)
        self._cursor.finished()

    def _delivered(self, pos: int, state, skips) -> None:
        self._cursor.delivered_here(pos)
        self._cursor.stream_state_here(state)
        if skips and not self._handout.replaying:  # (a replayed batch's were recorded before)
            self._dataset_fetcher.record(skips)
