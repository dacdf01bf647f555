"""``stoker.enable()``: every torch DataLoader in the process iterates on stoker's engine.

Frameworks build their own loaders (accelerate's ``prepare()``, the transformers ``Trainer``,
Lightning re-creating loaders for a DistributedSampler, timm's ``create_loader``, webdataset's
``WebLoader``), so the one place every loader passes through is torch's
``DataLoader._get_iterator``: enable() replaces it on the base class, which serves every subclass
that does not bring its own (created before or after the call), and hands the iterator
enable()'s own ``Options``. ``num_workers=0`` stays torch's; a ``stoker.DataLoader`` keeps its own
options (its ``_get_iterator`` is its own). A subclass that brings its own iterator (torchdata's
``StatefulDataLoader``) is left alone and named once, at its first iterator, by a hook on torch's
iterator base class.

Children see the same setting (``children.py``): spawn/forkserver children through the pickled
preparation data, processes started by ``stoker run`` through the environment; once a child
imports torch, it calls ``enable_in_child`` here.

Thread contract: ``enable``/``disable`` are safe from any thread (one lock); the patched methods
run in the thread that iterates.
"""

from __future__ import annotations

import json
import logging
import os
import threading

from ...common import torch_compat as _torch_compat
from ...config.options import Options
from ..iterators import serve
from ..iterators.multi import MultiProcessIter
from . import children

log = logging.getLogger("stoker")

ENV = children.ENV  # JSON of the options; set while enabled, read by children

_lock = threading.RLock()
_enabled: Options | None = None  # the options while enabled
_originals: dict = {}  # (owner, attribute name) -> the original attribute
_own_iterator_logged: set = set()  # loader classes named once already


def enable(**options) -> None:
    """From now on, every ``torch.utils.data.DataLoader`` in this process (any subclass, created
    before or after this call) runs its multi-process iterations on stoker's engine, with
    `options` (``on_error``, ``max_retries``, ``on_worker_death``, ``hang_timeout``, ...) as
    the defaults; a ``stoker.DataLoader`` keeps its own. ``num_workers=0`` stays torch's.
    Idempotent (a second call replaces the options), thread-safe, undone by ``disable()``."""
    opts = Options.from_mapping(options)
    global _enabled
    with _lock:
        if not _originals:
            _patch()
        _enabled = opts
        os.environ[ENV] = json.dumps(opts.to_json())
    log.debug("stoker: enabled for every torch DataLoader with %s", opts.describe())


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


def enable_in_child(raw: str) -> None:
    """What a child of an enabled process (spawn, forkserver, or started under ``stoker run``)
    calls once it imports torch (``children.py`` arms it): ``enable()`` with its parent's
    options, `raw` being ``$STOKER_ENABLE``, unless the child enabled stoker itself already."""
    if is_enabled():
        return
    try:
        options = json.loads(raw)
    except ValueError:
        options = None
    if not isinstance(options, dict):
        raise ValueError(f"{ENV}={raw!r} is not the JSON object of options that stoker.enable() "
                         "and `stoker run` write")
    enable(**options)


# -- the patches ---------------------------------------------------------------------------------

def _patch() -> None:
    import torch.utils.data

    base = torch.utils.data.DataLoader
    it_base = _torch_compat.base_iterator()
    orig_get_iterator = base._get_iterator
    orig_iter = base.__iter__
    orig_it_init = it_base.__init__

    def _get_iterator(self):
        opts = _enabled
        if opts is None or self.num_workers == 0:
            return orig_get_iterator(self)
        return serve.new_iterator(self, opts, "stoker.enable()")

    def __iter__(self):
        serve.forget_closed_iterator(self)
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
    children.hook_spawn(_originals, enable_in_child)


def _note_own_iterator(loader, iterator) -> None:
    """Names, once per loader class, a multi-process loader whose iterator is not stoker's."""
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
