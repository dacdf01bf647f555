"""``seed="per_sample"``: randomness that depends on the sample, not on the worker.

torch seeds each worker once (base seed + worker id), so the crop a sample gets depends on which
worker loaded it and on what that worker loaded before: another ``num_workers``, a restarted
worker or a resumed run draws other crops. Under ``seed="per_sample"`` the ``random``, NumPy and
torch (CPU) generators are seeded from (base seed, epoch, dataset index) just before each sample
is loaded, in the worker and in the ``num_workers=0`` path alike. The same sample then gets the
same draws whoever loads it, so batches are bit-identical whatever ``num_workers``, across worker
restarts and across resumes from a checkpoint (which restores the base seed and the epoch).

The base seed is the iterator's, drawn as torch draws it (from the loader's ``generator`` or
torch's global RNG when iteration starts); a checkpoint keeps it. A dataset with
``__getitems__`` loads a batch in one call: its generators are seeded once per batch, from the
batch's indices (still the same whatever the worker).

Thread contract: a ``SampleSeeder`` is used by the thread that loads samples; it seeds that
process's global generators, as torch's worker seeding does.
"""

from __future__ import annotations

import operator
import random
import zlib

MODES = (None, "per_sample")
_M64 = (1 << 64) - 1


def check(seed):
    if seed not in MODES:
        raise ValueError(
            f"seed must be None (torch's seeding: once per worker) or 'per_sample' (each sample "
            f"seeded from the base seed, the epoch and its index), got {seed!r}"
        )
    return seed


def _splitmix(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def _index_key(index) -> int:
    """A 64-bit number for a dataset index: ints as themselves, a batch of indices (what
    ``__getitems__`` receives) mixed element by element, anything else by a hash of its repr
    (stable across processes, unlike ``hash()`` of a str)."""
    if type(index) is int:
        return index & _M64
    if isinstance(index, (list, tuple)):
        h = len(index)
        for i in index:
            h = _splitmix(h ^ _index_key(i))
        return h
    try:
        return operator.index(index) & _M64
    except TypeError:
        return zlib.crc32(repr(index).encode("utf-8", "replace"))


def sample_seed(base_seed: int, epoch: int, index) -> int:
    """The seed of `index` in `epoch`: 63 bits, so every generator accepts it as is."""
    h = _splitmix((base_seed & _M64) ^ 0x5354_4F4B_4552)  # "STOKER"
    h = _splitmix(h ^ (epoch & _M64))
    h = _splitmix(h ^ _index_key(index))
    return h >> 1


class SampleSeeder:
    """Seeds `random`, NumPy's global RandomState and torch's default CPU generator for one
    sample. ``epoch`` is updated by the owner as epochs begin; it pickles (spawn) without its
    cached module references."""

    def __init__(self, base_seed: int, epoch: int):
        self.base_seed = base_seed
        self.epoch = epoch
        self._torch_gen = None
        self._np_seed = None

    def __getstate__(self):
        return {"base_seed": self.base_seed, "epoch": self.epoch}

    def __setstate__(self, d):
        self.__init__(d["base_seed"], d["epoch"])

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

    def __call__(self, index, position=None) -> None:
        """Seeds for dataset index `index` (a Fetcher's on_sample; `position` is not used)."""
        if self._torch_gen is None:
            self._bind()
        s = sample_seed(self.base_seed, self.epoch, index)
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


def seeder_for(loader, base_seed: int, epoch: int):
    """A SampleSeeder when the loader asks for ``seed="per_sample"``, else None."""
    from ._options import options_of

    if options_of(loader).get("seed") != "per_sample":
        return None
    return SampleSeeder(base_seed, epoch)
