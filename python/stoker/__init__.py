"""stoker keeps the accelerator fed: a multi-process data loader for PyTorch on a C++ engine.

    import stoker
    loader = stoker.DataLoader(dataset, batch_size=64, shuffle=True, num_workers=8)

or, for loaders a framework builds (Lightning, accelerate, the transformers Trainer, timm, ...):

    stoker.enable(on_error="skip")   # every torch DataLoader in the process, from now on

``stoker.DataLoader`` takes torch's arguments and yields the same batches, of the same types.
The engine itself (``stoker._stoker``), ``SharedList`` and the ``stoker`` command's ``doctor``
work without torch. Where torch is installed, ``DataLoader`` is imported with the package, so it
exists before any framework looks for DataLoader subclasses.

The package's folders say which process their code runs in (docs/design/README.md has the
map; tests/test_layers.py keeps imports one way): ``common``, ``pickling`` and ``datasets`` (any
process; the helpers a dataset imports), ``config`` (made here, carried whole to workers),
``wire`` (both ends of a worker's channel), ``worker`` (in a worker process), ``placements``
(where workers run: local processes, the node pool's processes, Ray actors), ``loader`` (the
training process: ``DataLoader``, its iterators, resume, autotune, the GPU, ``enable()``) and
``tools`` (``stoker run``, ``bench``, ``top``, ``doctor``, ``monitoring``). ``_compat`` keeps the
names earlier releases pickled and imported.
"""

import os as _os

# First: on a free-threaded Python, note which module's import turns the GIL back on (the
# interpreter's warning names it), from before the extension, torch and the rest are imported.
from .common import gil as _gil

_gil.watch()

from . import _compat  # noqa: E402
from .common.errors import (  # noqa: E402
    BatchEncodingError,
    CollateError,
    CorruptBatchError,
    EngineError,
    SharedMemoryLimitError,
    StateMismatchError,
    WorkerCrashed,
    WorkerError,
    WorkerHung,
)
from .config.placement import Node, Ray  # noqa: E402
from .datasets.per_worker import per_worker  # noqa: E402
from .datasets.shared_list import SharedList  # noqa: E402
from .datasets.worker_info import get_worker_info, sample_generator, sample_seed  # noqa: E402

__version__ = "0.3.0"

_compat.register()  # loaders pickled by stoker 0.1 name modules that are gone (stoker/_compat)

__all__ = [
    "BatchEncodingError",
    "deaths",
    "disable",
    "enable",
    "skipped",
    "stats",
    "CollateError",
    "CorruptBatchError",
    "DataLoader",
    "EngineError",
    "Node",
    "Ray",
    "SharedList",
    "SharedMemoryLimitError",
    "StateMismatchError",
    "WorkerCrashed",
    "WorkerError",
    "WorkerHung",
    "get_worker_info",
    "per_worker",
    "sample_generator",
    "sample_seed",
]


def enable(**options) -> None:
    """Every ``torch.utils.data.DataLoader`` in this process (any subclass, created before or
    after the call) runs its multi-process iterations on stoker's engine, with `options`
    (``on_error``, ``max_retries``, ``on_worker_death``, ``hang_timeout``, ...) as defaults.
    ``num_workers=0`` stays torch's. Undone by ``disable()``. ``stoker run script.py`` does this
    for a script, unchanged."""
    from .loader.integrations.enable import enable as _enable

    _enable(**options)


def disable() -> None:
    """Undoes ``enable()``."""
    from .loader.integrations.enable import disable as _disable

    _disable()


def stats(loader) -> dict:
    """``stats()`` of any DataLoader stoker served (a torch one under ``enable()`` too): workers,
    batches, data stall, deaths, skips, and ``served_by``."""
    from .loader.iterators.stats import loader_stats

    return loader_stats(loader)


def skipped(loader) -> list:
    """``loader.skipped`` of any DataLoader stoker served: a torch one under ``enable()`` or
    ``stoker run`` has no such attribute, so this is where its skipped samples are (``.index``,
    ``.reason``, ``.epoch``)."""
    from .config.records import records_of

    return records_of(loader).skipped


def deaths(loader) -> list:
    """``loader.deaths`` of any DataLoader stoker served (a torch one under ``enable()`` or
    ``stoker run`` too): every worker death so far."""
    from .config.records import records_of

    return records_of(loader).deaths


def _import_loader():
    try:
        from .loader.dataloader import DataLoader
    except ImportError as e:
        if "torch" not in str(e):
            raise
        raise ImportError(
            "stoker.DataLoader is a drop-in torch.utils.data.DataLoader and needs PyTorch: "
            "pip install torch. (stoker.SharedList and the engine work without it.)"
        ) from e
    return DataLoader


def __getattr__(name):
    if name == "DataLoader":
        DataLoader = _import_loader()
        globals()["DataLoader"] = DataLoader
        return DataLoader
    raise AttributeError(f"module 'stoker' has no attribute {name!r}")


# Eagerly where torch is installed: Lightning wraps the __init__ of every DataLoader subclass that
# exists when it starts, so stoker.DataLoader must exist by then. Not in the node's pool process
# (placements/node/pool.py, started with STOKER_NODE_POOL set): it serves ranks and never needs
# torch, which would cost it about 140 MB of its own.
if not _os.environ.get("STOKER_NODE_POOL"):
    try:
        DataLoader = _import_loader()
    except ImportError:
        pass

# Once per process, where the GIL is on in a free-threaded Python: which module turned it on
# (common/gil.py). Not in a worker, whose loader's process said it already (worker/process.py
# speaks for what a worker imports itself).
_gil.imported()
if not _os.environ.get("STOKER_NODE_POOL") and not _gil.in_worker_start():
    _gil.warn_if_enabled()
