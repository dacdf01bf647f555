"""stoker's own loader options (beyond torch's arguments): defaults, checks, and where a loader's
options are read from.

A ``stoker.DataLoader`` keeps them as public attributes named like its arguments (so a framework
that re-creates a loader from its attributes keeps them); any other torch DataLoader served under
``stoker.enable()`` takes enable()'s options. The iterator reads them through ``options_of`` and
the loader's memory (epochs, skips, deaths) through ``state_of``: one place for both kinds.
"""

from __future__ import annotations

DEATH_POLICIES = ("restart", "raise")
ERROR_POLICIES = ("raise", "skip", "retry")

DEFAULTS = {
    "on_worker_death": "restart",
    "max_restarts": None,
    "on_error": "raise",
    "max_retries": 3,
    "quarantine_after": 2,
    "hang_timeout": None,
    "stall_notice": 0.5,
    "max_shared_memory": "auto",
    "seed": None,
    # num_workers="auto" sets it: num_workers is then the most workers, and the iterator tunes
    # how many of them take tasks (_autotune.py). A framework re-creating the loader from its
    # attributes passes num_workers (the bound) and autotune back, and keeps the tuning.
    "autotune": False,
    # prefetch_factor="auto" sets it: prefetch_factor is then where the depth starts (torch's
    # 2), and the iterator tunes it (_autotune.py). Works under stoker.enable() too.
    "autotune_prefetch": False,
}
NAMES = tuple(DEFAULTS)


def check(options: dict) -> dict:
    """Checks each option's value (ValueError naming the option and what it accepts); returns
    the options as given (``max_shared_memory="auto"`` stays "auto": it is resolved per
    iterator, in the process that iterates)."""
    unknown = set(options) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"unknown stoker option(s) {sorted(unknown)}; the options are {NAMES}")
    o = options
    if "on_worker_death" in o and o["on_worker_death"] not in DEATH_POLICIES:
        raise ValueError(
            f"on_worker_death must be one of {DEATH_POLICIES}, got {o['on_worker_death']!r}")
    if "on_error" in o and o["on_error"] not in ERROR_POLICIES:
        raise ValueError(f"on_error must be one of {ERROR_POLICIES}, got {o['on_error']!r}")
    v = o.get("max_restarts")
    if v is not None and (not _is_int(v) or v < 0):
        raise ValueError(f"max_restarts must be None or an int >= 0, got {v!r}")
    if "max_retries" in o and (not _is_int(o["max_retries"]) or o["max_retries"] < 0):
        raise ValueError(f"max_retries must be an int >= 0, got {o['max_retries']!r}")
    v = o.get("quarantine_after", 1)
    if not _is_int(v) or v < 1:
        raise ValueError(f"quarantine_after must be an int >= 1, got {v!r}")
    if "max_shared_memory" in o:
        shared_memory_cap(o["max_shared_memory"])
    if "seed" in o:
        from ._seeding import check as check_seed

        check_seed(o["seed"])
    v = o.get("hang_timeout")
    if v is not None and not (isinstance(v, (int, float)) and v > 0):
        raise ValueError(f"hang_timeout must be None or > 0 seconds, got {v!r}")
    for name in ("autotune", "autotune_prefetch"):
        if name in o and not isinstance(o[name], bool):
            raise ValueError(f"{name} must be True or False, got {o[name]!r}")
    v = o.get("stall_notice")
    if v is not None and not (isinstance(v, (int, float)) and 0 <= v <= 1):
        raise ValueError(f"stall_notice must be None or a share of time in [0, 1], got {v!r}")
    return dict(options)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def shared_memory_cap(value):
    """max_shared_memory: bytes (int > 0), None (no cap), or "auto" (half the cgroup's memory
    limit; no cap without one)."""
    if value == "auto":
        from ._cgroup import default_shared_memory_cap

        return default_shared_memory_cap()
    if value is None or (_is_int(value) and value > 0):
        return value
    raise ValueError(
        f"max_shared_memory must be an int number of bytes > 0, None (no cap) or 'auto', "
        f"got {value!r}"
    )


def options_of(loader) -> dict:
    """The options an iterator of `loader` runs with, resolved (``max_shared_memory`` in
    bytes or None)."""
    from . import _enable

    if _enable.is_stoker_loader(loader):
        opts = {name: getattr(loader, name) for name in NAMES}
    else:
        opts = _enable.current_options()
    opts["max_shared_memory"] = shared_memory_cap(opts["max_shared_memory"])
    return opts


def state_of(loader):
    """The loader's memory across iterators (``_loader.LoaderState``), made on first use."""
    state = loader.__dict__.get("_stoker_state")
    if state is None:
        from ._state import LoaderState

        state = LoaderState()
        # torch's DataLoader.__setattr__ guards a few names only; this one is ours.
        loader.__dict__["_stoker_state"] = state
    return state
