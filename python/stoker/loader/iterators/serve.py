"""The one way into stoker's iterators, for ``stoker.DataLoader`` and for torch loaders served by
``stoker.enable()`` alike: the caller says which options and who serves the loader.

Called by the thread that calls ``iter(loader)``.
"""

from __future__ import annotations

from ...common import gil as _gil
from ...common import torch_compat as _torch_compat
from .multi import MultiProcessIter
from .single import SingleProcessIter


def forget_closed_iterator(loader) -> None:
    """Before torch's ``DataLoader.__iter__``: a persistent iterator that a worker's failure
    shut down cannot resume, so the next ``iter()`` starts afresh (stoker's, or one a subclass
    brings, torchdata's say); nor can live workers take a loaded state (each restores its own
    state, or is seeded as the saved epoch's were, as it starts): new ones do."""
    it = loader.__dict__.get("_iterator")
    if it is None:
        return
    if isinstance(it, MultiProcessIter):
        if it.reusable():
            return
        it.shutdown()
        loader._iterator = None
    elif _torch_compat.iterator_shut_down(it):
        loader._iterator = None


def new_iterator(loader, options, served_by: str):
    """The iterator for one ``iter(loader)`` (torch's ``_get_iterator``): stoker's one-process
    iterator with ``num_workers=0``, its multi-process iterator otherwise. `options`: a
    ``config.Options``; `served_by`: "stoker.DataLoader" or "stoker.enable()". On a free-threaded
    Python whose GIL a module turned on since ``import stoker``, says so once (common/gil.py)."""
    _gil.warn_if_enabled(stacklevel=5)  # (at the caller's `for` or iter())
    if loader.num_workers == 0:
        return SingleProcessIter(loader, options)
    loader.check_worker_number_rationality()
    return MultiProcessIter(loader, options, served_by)
