"""stoker keeps the accelerator fed: a multi-process data loader for PyTorch on a C++ engine.

    import stoker
    loader = stoker.DataLoader(dataset, batch_size=64, shuffle=True, num_workers=8)

``stoker.DataLoader`` takes torch's arguments and yields the same batches, of the same types.
The engine itself (``stoker._stoker``), ``SharedList`` and the ``stoker`` command's ``doctor``
work without torch; ``DataLoader`` needs torch and is imported on first use.
"""

from ._errors import (
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
from ._info import get_worker_info
from ._shared_list import SharedList

__version__ = "0.1.0"

__all__ = [
    "BatchEncodingError",
    "CollateError",
    "CorruptBatchError",
    "DataLoader",
    "EngineError",
    "SharedList",
    "SharedMemoryLimitError",
    "StateMismatchError",
    "WorkerCrashed",
    "WorkerError",
    "WorkerHung",
    "get_worker_info",
]


def __getattr__(name):
    if name == "DataLoader":
        try:
            from ._loader import DataLoader
        except ImportError as e:
            if "torch" not in str(e):
                raise
            raise ImportError(
                "stoker.DataLoader is a drop-in torch.utils.data.DataLoader and needs PyTorch: "
                "pip install torch. (stoker.SharedList and the engine work without it.)"
            ) from e
        globals()["DataLoader"] = DataLoader
        return DataLoader
    raise AttributeError(f"module 'stoker' has no attribute {name!r}")
