"""Seeding: workers seeded as torch seeds them, and ``seed="per_sample"``.

Per worker (torch's rule, the default): worker k seeds ``random`` and torch with base seed + k
and NumPy with torch's own ``_generate_state`` (``seed_worker``), so random augmentation drawn in
workers gives torch's values batch for batch.

Per sample (``seed="per_sample"``): torch's rule makes the crop a sample gets depend on which
worker loaded it and on what that worker loaded before, so another ``num_workers``, a restarted
worker or a resumed run draws other crops. Under ``seed="per_sample"`` the ``random``, NumPy and
torch (CPU) generators are seeded from (base seed, epoch, dataset index) just before each sample
is loaded, in the worker and in the ``num_workers=0`` path alike. The same sample then gets the
same draws whoever loads it, so batches are bit-identical whatever ``num_workers``, across worker
restarts and across resumes from a checkpoint (which restores the base seed and the epoch).

The base seed is the iterator's, drawn as torch draws it (from the loader's ``generator`` or
torch's global RNG when iteration starts); a checkpoint keeps it. A dataset with
``__getitems__`` loads a batch in one call: its generators are seeded once per batch, from the
batch's indices (still the same whatever the worker). An IterableDataset's samples have no
index: each is keyed by (worker id, its place in that worker's stream), which is stable across
runs and resumes with the same ``num_workers`` (each worker's share of the stream is its own).

Thread contract: a ``SampleSeeder`` is used by the thread that loads samples; it seeds that
process's global generators, as torch's worker seeding does. docs/design/seeding.md has the rules.
"""

from __future__ import annotations

import random

from ..common.indices import mix, seed_key
from ..datasets import worker_info as _info

MODES = (None, "per_sample")
MODES_TEXT = ("must be None (torch's seeding: once per worker) or 'per_sample' (each sample "
              "seeded from the base seed, the epoch and its index)")
_M64 = (1 << 64) - 1


def check(seed):
    if seed not in MODES:
        raise ValueError(f"seed {MODES_TEXT}, got {seed!r}")
    return seed


def seed_worker(base_seed: int, worker_id: int) -> int:
    """Seeds random, torch and NumPy in a worker as torch's worker loop does; returns the
    worker's seed (what ``get_worker_info().seed`` says)."""
    seed = base_seed + worker_id
    random.seed(seed)
    try:
        import torch

        torch.manual_seed(seed)
    except ImportError:
        return seed
    try:
        import numpy as np

        from ..common.torch_compat import numpy_seed

        np.random.seed(numpy_seed(base_seed, worker_id))
    except ImportError:
        pass
    return seed


def sample_seed(base_seed: int, epoch: int, index) -> int:
    """The seed of `index` in `epoch`: 63 bits, so every generator accepts it as is."""
    h = mix((base_seed & _M64) ^ 0x5354_4F4B_4552)  # "STOKER"
    h = mix(h ^ (epoch & _M64))
    h = mix(h ^ seed_key(index))
    return h >> 1


class SampleSeeder:
    """Seeds `random`, NumPy's global RandomState and torch's default CPU generator for one
    sample. ``epoch`` and ``base_seed`` are updated by the owner as epochs begin; it pickles
    (spawn) without its cached module references."""

    def __init__(self, base_seed: int, epoch: int, worker_id: int = 0):
        self.base_seed = base_seed
        self.epoch = epoch
        self.worker_id = worker_id  # a stream's samples are keyed by (worker, place)
        self._torch_gen = None
        self._np_seed = None

    def __getstate__(self):
        return {"base_seed": self.base_seed, "epoch": self.epoch, "worker_id": self.worker_id}

    def __setstate__(self, d):
        self.__init__(d["base_seed"], d["epoch"], d.get("worker_id", 0))

    def begin_epoch(self, epoch: int, base_seed: int) -> None:
        self.epoch = epoch
        self.base_seed = base_seed

    def _bind(self):
        try:
            import torch

            self._torch_gen = torch.default_generator
        except ImportError:
            self._torch_gen = False
        try:
            import numpy as np

            self._np_seed = np.random.seed
        except ImportError:
            self._np_seed = False

    def __call__(self, index, position=None, stream_pos=None) -> None:
        """Seeds for dataset index `index`, or for the stream's item at `stream_pos` (a
        fetcher's on_sample; `position` is not used)."""
        if self._torch_gen is None:
            self._bind()
        key = index if stream_pos is None else ("stream", self.worker_id, stream_pos)
        s = sample_seed(self.base_seed, self.epoch, key)
        _info.set_sample_seed(s)  # this thread's (stoker.sample_seed(): threads' own draws)
        random.seed(s)
        if self._np_seed:
            self._np_seed(s & 0xFFFF_FFFF)  # NumPy's legacy seeding takes 32 bits
        if self._torch_gen:
            self._torch_gen.manual_seed(s)


class KeptGenerators:
    """In the main process (``num_workers=0``), per-sample seeding must not reseed the user's
    generators (dropout, their own shuffles): their states are kept around each batch's loading
    and put back after it. Under ``seed="per_sample"`` loading in the main process thus draws
    nothing from them, whatever the dataset does."""

    def __enter__(self):
        self._random = random.getstate()
        self._np = self._torch = None
        try:
            import numpy as np

            self._np = np.random.get_state()
        except ImportError:
            pass
        try:
            import torch

            self._torch = torch.get_rng_state()
        except ImportError:
            pass
        return self

    def __exit__(self, *exc):
        random.setstate(self._random)
        if self._np is not None:
            import numpy as np

            np.random.set_state(self._np)
        if self._torch is not None:
            import torch

            torch.set_rng_state(self._torch)
        return False


def seeder_for(options, base_seed: int, epoch: int) -> SampleSeeder | None:
    """A SampleSeeder when `options` ask for ``seed="per_sample"``, else None."""
    if options.seed != "per_sample":
        return None
    return SampleSeeder(base_seed, epoch)
