"""Checkpoint and resume: ``loader.state_dict()`` and ``loader.load_state_dict(state)``.

A state names the epoch under way, which of its sampler positions the user has received (a
prefix, plus the few beyond it that ``in_order=False`` delivered early), and what regenerates the
epoch's sampler order: torch's global RNG state at the sampler's first draw (``RandomSampler``
without a generator draws its seed there), the states of the loader's generators as the epoch
began, the iterator's base seed, and the sampler's epoch (``set_epoch``). It also carries the
skipped and quarantined samples.

Resuming replays the sampler of that epoch under the saved RNG states and skips the positions
already delivered, without loading them: batches that were prefetched but not yielded are
simply loaded again, and the order of the rest of the epoch, and of the epochs after it, is the
uninterrupted run's. Positions count what the sampler yields (batches of indices), not workers'
work, so a state resumes under any ``num_workers``, 0 included.

The state is a plain dict of ints, strings, bytes, tuples and dicts with a fixed set of keys
(``torch.save`` and ``torch.distributed.checkpoint`` both take it), with a ``version``.

Thread contract: called by the thread that iterates the loader (as torch's iterators are).
"""

from __future__ import annotations

import weakref

import torch
from torch.utils.data import IterableDataset

from . import _elastic, _iter_state
from ._errors import StateMismatchError
from ._fetch import SkippedSample
from ._options import options_of, state_of

VERSION = 1
_KEY = "_stoker_resume"


# -- the record of one epoch ----------------------------------------------------------------------
class EpochRecord:
    """One epoch of one iterator: what regenerates its order and which positions were delivered."""

    def __init__(self, epoch: int, base_seed: int):
        self.epoch = epoch
        self.base_seed = base_seed
        self.torch_rng: bytes | None = None  # torch's global RNG at the sampler's first draw
        self.generators: tuple = ()  # the loader's generators as the epoch began
        self.sampler_epoch = None
        self.prefix = 0  # positions [0, prefix) delivered
        self.extra: set[int] = set()  # positions beyond the prefix delivered (in_order=False)
        self.yielded = 0  # batches the user received this epoch (informative)
        self.finished = False  # the iterator said StopIteration
        self.replay = False  # resuming: the first draw happens under torch_rng
        self.skip_prefix = 0
        self.skip_extra: frozenset = frozenset()
        self.task_pos: dict[int, int] = {}  # multi-process: task -> sampler position
        self.discard = 0  # IterableDataset: batches to load and drop before the first one
        self.order: bytes | None = None  # elastic resume: the epoch's explicit global order
        # A stateful IterableDataset (_iter_state.py): per worker, the state that goes with the
        # last batch the user received from it; per task in flight, the state sent with it.
        self.worker_states: dict[int, bytes] = {}
        self.task_state: dict[int, tuple[int, bytes]] = {}
        self.last_worker: int | None = None  # the worker of the last task received
        # Per worker, the state after the last outcome that reached the main process (a
        # restarted worker continues from it), and the workers any outcome came from.
        self.arrived_states: dict[int, bytes] = {}
        self.arrived_from: set[int] = set()

    def mark(self, pos: int) -> None:
        if pos == self.prefix:
            self.prefix += 1
            while self.prefix in self.extra:
                self.extra.discard(self.prefix)
                self.prefix += 1
        elif pos > self.prefix:
            self.extra.add(pos)


class SamplerStream:
    """The epoch's sampler iterator, counted: ``pos`` is the position of the last item drawn.
    Positions already delivered before a resume are drawn and dropped (never loaded). The first
    draw records torch's global RNG state, or, when resuming, happens under the saved one and
    leaves the caller's global RNG as it was."""

    def __init__(self, inner, record: EpochRecord):
        self.inner = inner
        self.record = record
        self.pos = -1
        self._first = True

    def __iter__(self):
        return self

    def __next__(self):
        rec = self.record
        if self._first:
            self._first = False
            if rec.replay and rec.torch_rng is not None:
                mine = torch.get_rng_state()
                torch.set_rng_state(_tensor(rec.torch_rng))
                try:
                    return self._draw()
                finally:
                    torch.set_rng_state(mine)
            rec.torch_rng = _bytes(torch.get_rng_state())
        return self._draw()

    def _draw(self):
        rec = self.record
        while True:
            item = next(self.inner)
            self.pos += 1
            if self.pos >= rec.skip_prefix and self.pos not in rec.skip_extra:
                return item


class Cursor:
    """What an iterator holds: its loader (weakly) and the record of the epoch it serves."""

    def __init__(self, loader, it=None):
        self._loader = weakref.ref(loader)
        self._it = weakref.ref(it) if it is not None else lambda: None
        self.record: EpochRecord | None = None
        self.stream: SamplerStream | None = None
        # What workers started for a resumed epoch restore (they take it as they start).
        self.iter_states = _iter_state.Box()
        self._first_worker: int | None = None

    @property
    def loader(self):
        return self._loader()

    def start_epoch(self, it) -> None:
        """Called as `it` begins an epoch (its ``_sampler_iter`` is new, the loader's epoch
        counter already advanced): applies a pending resume or records the epoch's start."""
        loader = self.loader
        tr = tracker(loader)
        pending, tr.pending = tr.pending, None
        rec = EpochRecord(state_of(loader).epoch, it._base_seed)
        if pending is not None:
            rec.base_seed = it._base_seed = pending["base_seed"]
            rec.torch_rng = pending["torch_rng"]
            rec.generators = pending["generators"]
            _set_generators(loader, rec.generators)
            rec.sampler_epoch = pending["sampler_epoch"]
            rec.order = pending.get("order")
            now = _sampler_epoch(loader)
            if now != rec.sampler_epoch:
                raise StateMismatchError(
                    f"stoker: the checkpoint was saved in the middle of an epoch whose sampler "
                    f"had set_epoch({rec.sampler_epoch}), but the sampler is now at epoch {now}: "
                    "the rest of that epoch would come from another order. Call "
                    f"sampler.set_epoch({rec.sampler_epoch}) before iterating (or after "
                    "load_state_dict, which sets it), as the saved run did."
                )
            states = dict(pending.get("worker_states") or ())
            if isinstance(loader.dataset, IterableDataset) and states:
                # Each worker's stream continues from its own saved state (_iter_state.py).
                rec.prefix = rec.skip_prefix = pending["position"]
                rec.yielded = pending["batches_yielded"]
                rec.worker_states = dict(states)
                rec.last_worker = pending.get("last_worker")
                self.iter_states.states = states
                if loader.num_workers == 0:
                    _restore_here(it, loader.dataset, states.get(0))
                elif rec.last_worker is not None:
                    self._first_worker = (rec.last_worker + 1) % loader.num_workers
            elif isinstance(loader.dataset, IterableDataset):
                # Workers' streams cannot be positioned: the batches already received are
                # loaded again and dropped (their positions are marked as they go by).
                rec.discard = pending["position"]
            else:
                rec.prefix = rec.skip_prefix = pending["position"]
                rec.extra = set(pending["delivered_after"])
                rec.skip_extra = frozenset(rec.extra)
                rec.yielded = pending["batches_yielded"]
            rec.replay = True
        else:
            rec.generators = _capture_generators(loader)
            rec.sampler_epoch = _sampler_epoch(loader)
            self.iter_states.states = {}
        if rec.order is not None:  # an epoch resumed elastically: this rank's share of the rest
            s = loader.sampler
            it._sampler_iter = _elastic.batches(
                _elastic.share(rec.order, s.num_replicas, s.rank), loader)
        self.record = rec
        self.stream = SamplerStream(it._sampler_iter, rec)
        it._sampler_iter = self.stream
        tr.current = rec

    # -- progress ------------------------------------------------------------------------------
    def sent(self, task: int) -> None:
        """Multi-process: `task` carries the item the stream drew last."""
        self.record.task_pos[task] = self.stream.pos

    def consumed(self, task: int) -> None:
        """Multi-process: the outcome of `task` reached the user (a batch, an error, or
        nothing when all its samples were skipped)."""
        rec = self.record
        pos = rec.task_pos.pop(task, None)
        if pos is not None:
            rec.mark(pos)
            rec.yielded += 1
        sent = rec.task_state.pop(task, None)
        if sent is not None:
            rec.worker_states[sent[0]] = sent[1]
            rec.last_worker = sent[0]

    def iter_state(self, task: int, worker_id: int, payload) -> None:
        """Multi-process: a worker's stateful IterableDataset, as it was after `task`."""
        self.record.task_state[task] = (worker_id, bytes(payload))

    def arrived(self, task: int, worker_id: int) -> None:
        """Multi-process: the outcome of `task` (a batch, an error, a dropped task) reached the
        main process from `worker_id`."""
        rec = self.record
        rec.arrived_from.add(worker_id)
        sent = rec.task_state.get(task)
        if sent is not None:
            rec.arrived_states[worker_id] = sent[1]

    def stream_known(self, worker_id: int) -> bool:
        """An IterableDataset: whether a new worker in place of `worker_id` can continue its
        stream exactly: it delivered nothing yet (a fresh start is its position), or its
        dataset is stateful and sent its state with what it delivered. Sets the state the
        new worker restores."""
        rec = self.record
        if rec is None:
            return False
        if worker_id in rec.arrived_states:
            self.iter_states.states[worker_id] = rec.arrived_states[worker_id]
            return True
        if worker_id not in rec.arrived_from:
            # Nothing delivered: from the start, or from the state the resume gave it.
            return True
        return False

    def first_worker(self, tasks) -> None:
        """A resumed IterableDataset: the first task goes to the worker whose turn it was in
        the saved run (the one after the worker of the last batch received), so batches come
        in the uninterrupted run's order."""
        w, self._first_worker = self._first_worker, None
        if w is not None:
            tasks.rotate(w)

    def consumed_last(self) -> None:
        """One process: the item drawn last reached the user."""
        self.record.mark(self.stream.pos)
        self.record.yielded += 1
        it = self._it()
        if it is not None and isinstance(it._dataset, IterableDataset):
            state = _iter_state.capture(it._dataset, _fetcher_iterator(it)[0])
            if state is not None:
                self.record.worker_states[0] = state

    def discarding(self) -> bool:
        """IterableDataset resumed: True while batches already received must be dropped."""
        rec = self.record
        if rec is None or rec.discard <= 0:
            return False
        rec.discard -= 1
        return True

    def finished(self) -> None:
        self.record.finished = True

    def superseded(self) -> bool:
        """True when ``load_state_dict`` ran after this iterator began and no iterator has taken
        the state yet: this iterator must start over from it (``iter()`` before
        ``load_state_dict``)."""
        loader = self.loader
        return loader is not None and tracker(loader).pending is not None


class Tracker:
    """Per loader: the epoch under way (``current``), and a loaded mid-epoch state that the
    next epoch to begin resumes (``pending``). Pickles with the loader (no live references)."""

    def __init__(self):
        self.current: EpochRecord | None = None
        self.pending: dict | None = None


def tracker(loader) -> Tracker:
    tr = loader.__dict__.get(_KEY)
    if tr is None:
        tr = Tracker()
        loader.__dict__[_KEY] = tr
    return tr


# -- iterator hooks -------------------------------------------------------------------------------
def before_iterator(loader):
    """Called before an iterator's base ``__init__`` draws its base seed: when a resume is
    pending, the caller's global RNG is kept so that the draw leaves it untouched (the saved run
    drew it before the checkpoint)."""
    if tracker(loader).pending is None:
        return None
    return torch.get_rng_state()


def attach(loader, it, kept_rng) -> Cursor:
    """Called after the base ``__init__``, before workers start: a pending resume sets the base
    seed the saved epoch had (so workers and per-sample seeds match it)."""
    pending = tracker(loader).pending
    if kept_rng is not None:
        torch.set_rng_state(kept_rng)
    if pending is not None:
        it._base_seed = pending["base_seed"]
    cursor = Cursor(loader, it)
    if pending is not None and pending.get("worker_states"):
        cursor.iter_states.states = dict(pending["worker_states"])  # workers start next
    return cursor


# -- state_dict / load_state_dict ----------------------------------------------------------------
def state_dict(loader) -> dict:
    tr = tracker(loader)
    st = state_of(loader)
    sd = {
        "version": VERSION,
        "loader": fingerprint(loader),
        "epoch": st.epoch,
        "finished": True,
        "position": 0,
        "delivered_after": (),
        "batches_yielded": 0,
        "base_seed": 0,
        "torch_rng": None,
        "generators": (),
        "generators_now": _capture_generators(loader),
        "sampler_epoch": None,
        "seed": options_of(loader).get("seed"),
        "skipped": tuple((s.index, s.reason, s.epoch) for s in st.skipped),
        "quarantined": tuple(sorted(st.quarantined, key=repr)),
        "distributed": _elastic.describe(loader),
        "order": None,
        "worker_states": (),
        "last_worker": None,
    }
    if tr.pending is not None:  # loaded, not iterated yet: the same state again
        for k in ("epoch", "finished", "position", "delivered_after", "batches_yielded",
                  "base_seed", "torch_rng", "generators", "sampler_epoch", "order",
                  "worker_states", "last_worker"):
            sd[k] = tr.pending.get(k)
        return sd
    rec = tr.current
    if rec is None or rec.epoch != st.epoch:
        return sd  # no epoch begun in this process (or since a finished state was loaded)
    sd.update({
        "epoch": rec.epoch,
        "finished": rec.finished,
        "position": rec.prefix,
        "delivered_after": tuple(sorted(rec.extra)),
        "batches_yielded": rec.yielded,
        "base_seed": rec.base_seed,
        "torch_rng": rec.torch_rng,
        "generators": rec.generators,
        "sampler_epoch": rec.sampler_epoch,
        "order": rec.order,
        "worker_states": tuple(sorted(rec.worker_states.items())),
        "last_worker": rec.last_worker,
    })
    return sd


def load_state_dict(loader, sd) -> None:
    elastic = isinstance(sd, (list, tuple))
    if elastic:  # the states of all ranks of a saved job (_elastic.py)
        for one in sd:
            _check_version(one)
        sd = _elastic.merge(loader, sd)
    _check_version(sd)
    _check_distributed(sd, loader, elastic)
    _check_fingerprint(sd["loader"], fingerprint(loader), elastic)
    tr = tracker(loader)
    st = state_of(loader)
    from ._recovery import key

    st.skipped = [SkippedSample(i, r, e) for i, r, e in sd["skipped"]]
    st.logged = {key(s.index) for s in st.skipped}
    st.quarantined = set(sd["quarantined"])
    tr.current = None
    if sd["finished"]:
        # The next iter() begins the next epoch, with the generators where the saved run had them.
        tr.pending = None
        st.epoch = sd["epoch"]
        _set_generators(loader, sd["generators_now"])
        return
    st.epoch = sd["epoch"] - 1  # the epoch that begins next is the saved one
    tr.pending = {k: sd.get(k) for k in ("epoch", "finished", "position", "delivered_after",
                                         "batches_yielded", "base_seed", "torch_rng",
                                         "generators", "sampler_epoch", "order",
                                         "worker_states", "last_worker")}
    if sd["sampler_epoch"] is not None:
        s = _epoch_sampler(loader)
        if s is not None:
            s.set_epoch(sd["sampler_epoch"])


def _check_version(sd) -> None:
    if not isinstance(sd, dict) or "version" not in sd:
        raise StateMismatchError(
            f"stoker: load_state_dict expects a dict made by stoker.DataLoader.state_dict() (or "
            f"a list of them, one per rank of a saved job), got "
            f"{type(sd).__name__}{' without a version' if isinstance(sd, dict) else ''}."
        )
    if sd["version"] != VERSION:
        raise StateMismatchError(
            f"stoker: this state has version {sd['version']!r}; this stoker reads version "
            f"{VERSION}. Resume with the stoker release that saved it."
        )


def _check_distributed(sd: dict, loader, elastic: bool) -> None:
    saved, here = sd.get("distributed"), _elastic.describe(loader)
    if elastic or saved is None or here is None:
        return
    if saved["num_replicas"] != here["num_replicas"]:
        raise StateMismatchError(
            f"stoker: this state was saved by rank {saved['rank']} of {saved['num_replicas']} "
            f"ranks; this loader's DistributedSampler has {here['num_replicas']}. One rank's "
            "state cannot say what the other ranks delivered: pass the states of all ranks of "
            "the saved job, as a list, to load_state_dict (every rank loads the same list), "
            "and stoker splits the rest of the epoch among the new ranks."
        )


# -- what must match ------------------------------------------------------------------------------
def fingerprint(loader) -> dict:
    """What decides which indices each batch holds: a state resumes only on a loader that
    agrees on all of it."""
    ds = loader.dataset
    iterable = isinstance(ds, IterableDataset)
    try:
        length = None if iterable else len(ds)
    except TypeError:
        length = None
    try:
        batches = None if iterable else len(loader)
    except TypeError:
        batches = None
    bs = loader.batch_sampler
    return {
        "dataset_kind": "iterable" if iterable else "map",
        "dataset_length": length,
        "batch_size": loader.batch_size,
        "drop_last": loader.drop_last,
        "sampler": _qualname(loader.sampler),
        "batch_sampler": _qualname(bs) if bs is not None else "",
        "batches_per_epoch": batches,
        "generators": tuple(path for path, _ in _generators(loader)),
        # An IterableDataset is split among workers (each iterates its own copy): another
        # num_workers gives other batches.
        "num_workers": loader.num_workers if iterable else None,
    }


def _check_fingerprint(saved: dict, here: dict, elastic: bool = False) -> None:
    # Resized (elastic): each rank has another share of the epoch, so another number of batches.
    ignore = ("batches_per_epoch",) if elastic else ()
    diffs = [f"{k}: saved {saved.get(k)!r}, here {here.get(k)!r}"
             for k in here if k not in ignore and saved.get(k) != here.get(k)]
    if "num_workers" in (d.split(":")[0] for d in diffs):
        diffs.append("(an IterableDataset is iterated by each worker on its own, so its batches "
                     "depend on num_workers, and a stateful one's state is saved per worker, "
                     "each worker resuming its own state: resume it with the num_workers it "
                     "was saved with)")
    if diffs:
        raise StateMismatchError(
            "stoker: this state was saved by a loader that orders its samples differently, so "
            "resuming from it would repeat or lose samples. What differs:\n  - "
            + "\n  - ".join(diffs)
            + "\nBuild the loader as the saved run did (dataset, batch_size, drop_last, sampler, "
            "generator), or start afresh without load_state_dict."
        )


def _qualname(obj) -> str:
    t = type(obj)
    return f"{t.__module__}.{t.__qualname__}"


# -- a stateful IterableDataset in the main process (num_workers=0) ------------------------------
def _fetcher_iterator(it):
    """(the dataset's live iterator, a setter for it) in a one-process iterator's fetcher:
    stoker's (``_PolicyFetcher``) or torch's own."""
    f = it._dataset_fetcher
    inner = getattr(f, "fetcher", None)
    if inner is not None:
        return inner.iterator, lambda i: setattr(inner, "iterator", i)
    return getattr(f, "dataset_iter", None), lambda i: setattr(f, "dataset_iter", i)


def _restore_here(it, dataset, payload) -> None:
    if payload is None:
        return
    _iter_state.restore_dataset(dataset, payload)
    fresh = iter(dataset)
    _iter_state.restore_iterator(fresh, payload)
    _fetcher_iterator(it)[1](fresh)


# -- RNG states -----------------------------------------------------------------------------------
def _bytes(state: torch.Tensor) -> bytes:
    return state.numpy().tobytes()


def _tensor(b: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(b), dtype=torch.uint8)


def _generators(loader) -> list:
    """(path, torch.Generator) for each distinct generator the loader's order depends on."""
    out, seen = [], set()
    bs = loader.batch_sampler
    for path, owner in (("generator", loader), ("sampler", loader.sampler),
                        ("batch_sampler", bs), ("batch_sampler.sampler", getattr(bs, "sampler",
                                                                                  None))):
        g = getattr(owner, "generator", None) if owner is not None else None
        if isinstance(g, torch.Generator) and id(g) not in seen:
            seen.add(id(g))
            out.append((path, g))
    return out


def _capture_generators(loader) -> tuple:
    return tuple(_bytes(g.get_state()) for _, g in _generators(loader))


def _set_generators(loader, states) -> None:
    for (_, g), s in zip(_generators(loader), states):
        g.set_state(_tensor(s))


def _epoch_sampler(loader):
    bs = loader.batch_sampler
    for s in (getattr(bs, "sampler", None), bs, loader.sampler):
        if s is not None and hasattr(s, "set_epoch"):
            return s
    return None


def _sampler_epoch(loader):
    s = _epoch_sampler(loader)
    return getattr(s, "epoch", None) if s is not None else None
