"""stoker's own loader options (beyond torch's arguments), each declared once.

``Options`` is a frozen dataclass. Every field's declaration carries its default, its check, how
its value is read from text (the ``stoker run --FLAG`` and the ``STOKER_<OPTION>`` variable), and
a line for people; ``DataLoader``'s keywords, ``enable()``, ``stoker run`` and the README's table
(checked by a test) all come from it. An ``Options`` is checked when it is made, so a part that
holds one never checks again.

Who decides which options an iterator runs with: its caller. ``stoker.DataLoader`` reads its own
public attributes (``Options.of``; frameworks that re-create a loader from its attributes pass
them back), ``stoker.enable()`` hands its own ``Options`` to the loaders it serves. Nothing below
asks where options came from.

``max_shared_memory="auto"`` stays "auto" here; ``shared_memory_cap()`` resolves it in the
process that iterates (half the memory cgroup's limit there).

Immutable values: safe to share between threads.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..common import system as _system
from . import placement as _placement
from . import seeding

DEATH_POLICIES = ("restart", "raise")
ERROR_POLICIES = ("raise", "skip", "retry")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# -- checks: each returns None when the value is good, else what the option accepts --------------
def _one_of(choices):
    def check(v):
        return None if v in choices else f"must be one of {choices}"
    return check


def _int_at_least(low, none_ok=False):
    def check(v):
        if v is None and none_ok:
            return None
        if _is_int(v) and v >= low:
            return None
        return f"must be {'None or ' if none_ok else ''}an int >= {low}"
    return check


def _positive_seconds(v):
    return None if v is None or (_is_number(v) and v > 0) else "must be None or > 0 seconds"


def _share(v):
    if v is None or (_is_number(v) and 0 <= v <= 1):
        return None
    return "must be None or a share of time in [0, 1]"


def _bool(v):
    return None if isinstance(v, bool) else "must be True or False"


def _bytes_cap(v):
    if v is None or v == "auto" or (_is_int(v) and v > 0):
        return None
    return "must be an int number of bytes > 0, None (no cap) or 'auto'"


def _seed(v):
    return None if v in seeding.MODES else seeding.MODES_TEXT


# -- reading from text (flags, environment variables) --------------------------------------------
def _text_int(t):
    return int(t)


def _text_float(t):
    return float(t)


def _text_bool(t):
    return t.lower() in ("1", "true", "yes", "on")


def _text_bytes(t):
    return t if t == "auto" else int(t)


def _text_str(t):
    return t


def _placement_ok(v):
    try:
        _placement.normalize(v)
    except (ValueError, TypeError):
        return ("must be None (local processes), 'local', 'node', stoker.Node(...), 'ray' or "
                "stoker.Ray(...)")
    return None


def _device(v):
    """None, "cuda", "cuda:N" or a torch.device of those (read as its text)."""
    if v is None:
        return None
    kind, _, index = str(v).partition(":")
    if kind == "cuda" and (not index or index.isdigit()):
        return None
    return "must be None, \"cuda\", \"cuda:N\" or torch.device(\"cuda\", N)"


MAX_THREADS_PER_WORKER = 256


def _threads(v):
    if v is None or v == "auto" or (_is_int(v) and 1 <= v <= MAX_THREADS_PER_WORKER):
        return None
    return f"must be None, an int in [1, {MAX_THREADS_PER_WORKER}] or 'auto'"


def _text_threads(t):
    return t if t == "auto" else None if t in ("", "none", "None") else int(t)


def _str_or_none(v):
    return None if v is None or isinstance(v, str) else "must be None or a str"


def _option(default, check, parse, doc, shown=None):
    """`shown`: how people see the default, when not as its repr (the README's table)."""
    return field(default=default, metadata={"check": check, "parse": parse, "doc": doc,
                                            "shown": shown if shown is not None else
                                            _shown(default)})


def _shown(value) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


@dataclass(frozen=True)
class Options:
    on_worker_death: str = _option(
        "restart", _one_of(DEATH_POLICIES), _text_str,
        "a dead worker is restarted and its batches re-issued (\"restart\"), or "
        "WorkerCrashed is raised (\"raise\")")
    max_restarts: int | None = _option(
        None, _int_at_least(0, none_ok=True), _text_int,
        "restarts allowed per epoch (None: 3 * num_workers)", shown="3 * num_workers")
    on_error: str = _option(
        "raise", _one_of(ERROR_POLICIES), _text_str,
        "an exception in __getitem__ / collate_fn: raise, skip the sample, or retry it")
    max_retries: int = _option(3, _int_at_least(0), _text_int,
                               "attempts per sample with on_error=\"retry\"")
    quarantine_after: int = _option(
        2, _int_at_least(1), _text_int,
        "deaths while loading one index that make it poison")
    threads_per_worker: int | str | None = _option(
        None, _threads, _text_threads,
        "samples each worker loads at once (threads, or an async dataset's coroutines); "
        "\"auto\": raised while the worker waits rather than computes; None: 1, and \"auto\" "
        "for a dataset whose __getitem__ or __getitems__ is an async def",
        shown='None (1; "auto" if async)')
    hang_timeout: float | None = _option(
        None, _positive_seconds, _text_float,
        "seconds one sample may take before its worker is killed and handled as a death")
    stall_notice: float | None = _option(
        0.5, _share, _text_float,
        "log once when the loop waits for data more than this share of its time")
    max_shared_memory: int | str | None = _option(
        "auto", _bytes_cap, _text_bytes,
        "bytes all slots may take (\"auto\": half the memory cgroup's limit)")
    seed: str | None = _option(
        None, _seed, _text_str,
        "\"per_sample\": each sample's generators seeded from (base seed, epoch, index)")
    autotune: bool = _option(
        False, _bool, _text_bool,
        "num_workers=\"auto\" sets it: the active worker count is tuned up to num_workers")
    autotune_prefetch: bool = _option(
        False, _bool, _text_bool,
        "prefetch_factor=\"auto\" sets it: the depth of each worker's queue is tuned")
    placement: object = _option(
        None, _placement_ok, _text_str,
        "where workers run: None (local processes), stoker.Node(...) (one pool per machine for "
        "every rank of the job) or stoker.Ray(...) (actors on a Ray cluster)")
    ray_address: str | None = _option(
        None, _str_or_none, _text_str,
        "the Ray cluster of placement=\"ray\" (as ray.init takes it)")
    device: str | None = _option(
        None, _device, _text_str,
        "batches arrive on this CUDA device (\"cuda\", \"cuda:N\", a torch.device), "
        "copied on a side stream while the loop works on the one before")

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            problem = f.metadata["check"](value)
            if problem is not None:
                raise ValueError(f"{f.name} {problem}, got {value!r}")
        # one form for every way a placement is given ("ray", a dict from JSON, a Ray)
        object.__setattr__(self, "placement",
                           _placement.normalize(self.placement, self.ray_address))
        if isinstance(self.placement, _placement.Node):
            # a pool's workers serve every rank: a sample's values may not depend on which of
            # them loaded it (docs/design/node.md), and the pool, not each rank, sizes them
            object.__setattr__(self, "seed", "per_sample")
            object.__setattr__(self, "autotune", False)
        if self.device is not None:  # one form: text ("cuda:1"), also for a torch.device
            object.__setattr__(self, "device", str(self.device))

    # -- making one ------------------------------------------------------------------------------
    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_mapping(cls, values: dict) -> Options:
        """Options from `values` (the rest default); TypeError names an unknown option."""
        unknown = set(values) - set(cls.names())
        if unknown:
            raise TypeError(f"unknown stoker option(s) {sorted(unknown)}; the options are "
                            f"{cls.names()}")
        return cls(**values)

    @classmethod
    def of(cls, loader) -> Options:
        """The options a ``stoker.DataLoader`` keeps as its public attributes."""
        return cls(**{name: getattr(loader, name) for name in cls.names()})

    def replace(self, **changes) -> Options:
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.names()}

    def to_json(self) -> dict:
        """``as_dict`` with the placement as plain data (what children read from
        ``STOKER_ENABLE``)."""
        d = self.as_dict()
        if d["placement"] is not None:
            d["placement"] = d["placement"].to_dict()
        return d

    # -- text: flags and environment variables ---------------------------------------------------
    @staticmethod
    def flag(name: str) -> str:
        return "--" + name.replace("_", "-")

    @staticmethod
    def env_var(name: str) -> str:
        return "STOKER_" + name.upper()

    @classmethod
    def parse(cls, name: str, text: str):
        """An option's value from a flag or an environment variable ("none": None)."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if name not in fields:
            raise ValueError(f"unknown option {cls.flag(name)}")
        if text.lower() == "none":
            return None
        try:
            return fields[name].metadata["parse"](text)
        except ValueError:
            raise ValueError(f"{cls.flag(name)}: cannot read {text!r}") from None

    @classmethod
    def from_environment(cls, environ) -> dict:
        """The options set as ``STOKER_<OPTION>`` variables in `environ`, parsed."""
        out = {}
        for name in cls.names():
            raw = environ.get(cls.env_var(name))
            if raw:
                try:
                    out[name] = cls.parse(name, raw)
                except ValueError:
                    raise ValueError(f"{cls.env_var(name)}: cannot read {raw!r}") from None
        return out

    @classmethod
    def doc(cls, name: str) -> str:
        return {f.name: f.metadata["doc"] for f in dataclasses.fields(cls)}[name]

    @classmethod
    def shown_default(cls, name: str) -> str:
        """The default as the README shows it."""
        return {f.name: f.metadata["shown"] for f in dataclasses.fields(cls)}[name]

    def describe(self) -> str:
        """The options that differ from the defaults, for a log line."""
        default = Options()
        shown = {k: v for k, v in self.as_dict().items() if getattr(default, k) != v}
        return ", ".join(f"{k}={v!r}" for k, v in shown.items()) or "default options"

    # -- derived ---------------------------------------------------------------------------------
    def shared_memory_cap(self) -> int | None:
        """max_shared_memory in bytes (None: no cap), "auto" resolved here and now."""
        return shared_memory_cap(self.max_shared_memory)

    def restart_budget(self, num_workers: int) -> int:
        return 3 * num_workers if self.max_restarts is None else self.max_restarts


def shared_memory_cap(value) -> int | None:
    """max_shared_memory: bytes (int > 0), None (no cap), or "auto" (half the cgroup's memory
    limit; no cap without one)."""
    problem = _bytes_cap(value)
    if problem is not None:
        raise ValueError(f"max_shared_memory {problem}, got {value!r}")
    if value == "auto":
        return _system.default_shared_memory_cap()
    return value


def shared_memory_share(cap: int | None, workers: int) -> int | None:
    """Each worker's part of the cap: what one worker's slots may take (None: no cap)."""
    return max(1, cap // max(1, workers)) if cap else None
