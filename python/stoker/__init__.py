"""stoker keeps the accelerator fed: a multi-process data loader for PyTorch on a C++ engine.

    import stoker
    loader = stoker.DataLoader(dataset, batch_size=64, shuffle=True, num_workers=8)

``stoker.DataLoader`` takes torch's arguments and yields the same batches, of the same types.
"""

from ._errors import (
    BatchEncodingError,
    CollateError,
    CorruptBatchError,
    EngineError,
    WorkerCrashed,
    WorkerError,
    WorkerHung,
)
from ._info import get_worker_info
from ._loader import DataLoader
from ._shared_list import SharedList

__version__ = "0.1.0"

__all__ = [
    "BatchEncodingError",
    "CollateError",
    "CorruptBatchError",
    "DataLoader",
    "SharedList",
    "EngineError",
    "WorkerCrashed",
    "WorkerError",
    "WorkerHung",
    "get_worker_info",
]
