"""``stoker.enable()``: every torch DataLoader in the process iterates on stoker's engine.

Frameworks build their own loaders (accelerate's ``prepare()``, the transformers ``Trainer``,
Lightning re-creating loaders for a DistributedSampler, timm's ``create_loader``, webdataset's
``WebLoader``), so the one place every loader passes through is torch's
``DataLoader._get_iterator``: enable() replaces it on the base class, which serves every subclass
that does not bring its own (created before or after the call). ``num_workers=0`` stays torch's.
A subclass that brings its own iterator (torchdata's ``StatefulDataLoader``) is left alone and
named once, at its first iterator, by a hook on torch's iterator base class.

Children see the same setting: spawn/forkserver children through the pickled preparation data
(``_autoenable``), and processes started by ``stoker run`` through the environment.
"""

from __future__ import annotations

import json
import logging
import os
import threading

from . import _options

log = logging.getLogger("stoker")

ENV = "STOKER_ENABLE"  # JSON of the options; set while enabled, read by children (_autoenable)

_lock = threading.RLock()
_enabled: dict | None = None  # the options while enabled
_originals: dict = {}  # (owner, attribute name) -> the original attribute
_own_iterator_logged: set = set()  # loader classes named once already


def enable(**options) -> None:
    """From now on, every ``torch.utils.data.DataLoader`` in this process (any subclass, created
    before or after this call) runs its multi-process iterations on stoker's engine, with
    `options` (``on_error``, ``max_retries``, ``on_worker_death``, ``hang_timeout``, ...) as
    the defaults; a ``stoker.DataLoader`` keeps its own. ``num_workers=0`` stays torch's.
    Idempotent (a second call replaces the options), thread-safe, undone by ``disable()``."""
    opts = {**_options.DEFAULTS, **_options.check(options)}
    global _enabled
    with _lock:
        if not _originals:
            _patch()
        _enabled = opts
        os.environ[ENV] = json.dumps(opts)
    log.debug("stoker: enabled for every torch DataLoader with %s", _describe(opts))


def disable() -> None:
    """Undoes ``enable()``: loaders created by torch's DataLoader iterate with torch's
    iterator again (an iterator already running finishes as it started)."""
    global _enabled
    with _lock:
        for (owner, name), original in _originals.items():
            setattr(owner, name, original)
        _originals.clear()
        _enabled = None
        os.environ.pop(ENV, None)


def is_enabled() -> bool:
    return _enabled is not None


def current_options() -> dict:
    """enable()'s options (the defaults when not enabled)."""
    opts = _enabled
    return dict(opts if opts is not None else _options.DEFAULTS)


def is_stoker_loader(loader) -> bool:
    from ._loader import DataLoader

    return isinstance(loader, DataLoader)


def served_by(loader) -> str:
    """Who serves `loader` with stoker's engine: "stoker.DataLoader" or "stoker.enable()",
    followed by the loader's class name."""
    who = "stoker.DataLoader" if is_stoker_loader(loader) else "stoker.enable()"
    cls = type(loader).__qualname__
    return who if cls == "DataLoader" and who == "stoker.DataLoader" else f"{who} {cls}"


def state_and_options(loader):
    return _options.state_of(loader), _options.options_of(loader)


def announce(loader, iterator) -> None:
    """A multi-process iterator of `loader` has started: records who serves the loader
    (``stats()['served_by']``), logs it at its first iterator, and has the iterator's workers
    stopped cleanly at interpreter exit (``_exit``)."""
    from . import _exit

    _exit.track(iterator)
    state = _options.state_of(loader)
    first = state.served_by is None
    state.served_by = "stoker.DataLoader" if is_stoker_loader(loader) else "stoker.enable()"
    if first:
        cls = type(loader)
        log.info(
            "stoker: %s.%s (%s) is served by stoker's engine: %d workers (%s), %s",
            cls.__module__, cls.__qualname__, state.served_by, iterator._num_workers,
            iterator._set._method, _describe(iterator._opts))


def _describe(opts: dict) -> str:
    shown = {k: v for k, v in opts.items() if _options.DEFAULTS.get(k) != v}
    if shown.get("max_shared_memory", 0) is None:  # "auto" without a cgroup limit
        del shown["max_shared_memory"]
    return ", ".join(f"{k}={v!r}" for k, v in shown.items()) or "default options"


# -- the patches ---------------------------------------------------------------------------------

def _patch() -> None:
    import torch.utils.data

    from . import _autoenable, _torch_compat

    base = torch.utils.data.DataLoader
    it_base = _torch_compat.base_iterator()
    orig_get_iterator = base._get_iterator
    orig_iter = base.__iter__
    orig_it_init = it_base.__init__

    def _get_iterator(self):
        if _enabled is None or self.num_workers == 0:
            return orig_get_iterator(self)
        from ._iterator import MultiProcessIter

        self.check_worker_number_rationality()
        return MultiProcessIter(self)

    def __iter__(self):
        # A persistent stoker iterator that a worker's failure shut down cannot resume.
        it = self.__dict__.get("_iterator")
        if it is not None and getattr(it, "_shutdown", False):
            self._iterator = None
        return orig_iter(self)

    def __init__(self, loader, *args, **kwargs):
        orig_it_init(self, loader, *args, **kwargs)
        _note_own_iterator(loader, self)

    _get_iterator.__doc__ = orig_get_iterator.__doc__
    __iter__.__doc__ = orig_iter.__doc__
    _originals[(base, "_get_iterator")] = orig_get_iterator
    _originals[(base, "__iter__")] = orig_iter
    _originals[(it_base, "__init__")] = orig_it_init
    base._get_iterator = _get_iterator
    base.__iter__ = __iter__
    it_base.__init__ = __init__
    _autoenable.hook_spawn(_originals)


def _note_own_iterator(loader, iterator) -> None:
    """Names, once per loader class, a multi-process loader whose iterator is not stoker's."""
    from ._iterator import MultiProcessIter

    if _enabled is None or isinstance(iterator, MultiProcessIter):
        return
    if getattr(loader, "num_workers", 0) == 0:
        return
    cls = type(loader)
    with _lock:
        if cls in _own_iterator_logged:
            return
        _own_iterator_logged.add(cls)
    it = type(iterator)
    log.warning(
        "stoker: %s.%s brings its own iterator (%s.%s), so stoker.enable() leaves it alone: its "
        "batches come from that iterator's workers, not stoker's engine, and stoker's options "
        "do not apply to it.", cls.__module__, cls.__qualname__, it.__module__, it.__qualname__)
