"""An exception raised in a worker, raised again in the main process as the user's own type.

As torch does: "Caught ValueError in DataLoader worker process 1" plus the worker's traceback,
with stoker's addition of the dataset index being loaded. stoker's own diagnoses of the data
(``CollateError``, ``BatchEncodingError``) keep their message; a full ``max_shared_memory``
says what the user holds. Raised by the iterating thread.
"""

from __future__ import annotations

from ...common.errors import (
    BatchEncodingError,
    CollateError,
    SharedMemoryLimitError,
    shared_memory_limit_message,
)
from ...wire import protocol


class WorkerFailure:
    """A task's outcome when the user's code raised in the worker (``TaskFailed``'s report)."""

    def __init__(self, report: dict):
        self.report = report

    def reraise(self, slot_usage=dict):
        """Raises the worker's exception; `slot_usage()` gives what the user holds (for a full
        shared-memory cap)."""
        r = self.report
        exc_type = r["type"]
        if exc_type is SharedMemoryLimitError:
            raise exc_type(shared_memory_limit_message(r["message"], slot_usage()))
        if exc_type in (CollateError, BatchEncodingError):
            # stoker's own diagnosis of the data: the message already names index, field, type.
            raise exc_type(f"{r['message']}\n(in DataLoader worker process {r['worker_id']})")
        where = f"in DataLoader worker process {r['worker_id']}"
        if r["index"] is not None:
            where += f" while loading dataset index {protocol.short_repr(r['index'])}"
        msg = f"Caught {r['type_name'].rsplit('.', 1)[-1]} {where}.\nOriginal {r['traceback']}"
        if exc_type is None:
            raise RuntimeError(msg + f"\n(the original type {r['type_name']} is not importable)")
        if exc_type is KeyError:
            raise KeyError(_KeyErrorMessage(msg))
        try:
            if getattr(exc_type, "message", None):  # as torch: types whose constructor wants it
                exc = exc_type(message=msg)
            else:
                exc = exc_type(msg)
        except Exception:
            raise RuntimeError(msg) from None
        raise exc


class _KeyErrorMessage(str):
    """KeyError repr()s its argument; this keeps the traceback readable."""

    def __repr__(self):
        return self
