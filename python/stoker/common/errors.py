"""stoker's exceptions: one small hierarchy users can catch (docs/design/errors.md).

Errors raised by the user's own code (``__getitem__``, ``collate_fn``) keep their own type, as in
torch; these classes cover what the loader itself has to say. A leaf: imports nothing of stoker
but ``common.system`` (for a message's byte counts).

Plain exception classes: raised and caught on any thread.
"""


class EngineError(RuntimeError):
    """The engine failed: a system call, shared memory, or the control channel."""


class CorruptBatchError(EngineError):
    """A worker's slot did not hold a valid batch; it was dropped without harming this process."""


class SharedMemoryLimitError(EngineError, MemoryError):
    """A worker found no room for a batch under ``max_shared_memory``: the user still holds the
    batches that fill it. Also a ``MemoryError``."""


def shared_memory_limit_message(worker_message: str, usage: dict) -> str:
    """The worker's report, with what the user holds over all workers and what to do."""
    from .system import human_bytes

    return (
        f"{worker_message}\nIn all, your code holds {usage.get('slots_held_by_user', 0)} "
        f"batch(es) whose tensors keep {human_bytes(usage.get('bytes_held_by_user', 0))} of "
        "shared memory in use. Drop references to batches (and to tensors sliced from them) "
        "you no longer need, or .clone() what you keep; lower prefetch_factor; or raise "
        "DataLoader(max_shared_memory=...) (None: no cap)."
    )


class CollateError(RuntimeError):
    """Samples of one batch could not be combined (different shapes, lengths or keys)."""


class BatchEncodingError(TypeError):
    """A batch holds an object that can be neither laid out in shared memory nor pickled."""


class GILEnabledWarning(RuntimeWarning):
    """The GIL is on in a free-threaded Python, turned on by a module's import
    (``common/gil.py``): threads take turns on one core."""


class FallbackRequired(Exception):
    """Internal: the C++ collate fast path declined; collate in Python instead."""


class WorkerError(RuntimeError):
    """A worker process failed."""


class WorkerCrashed(WorkerError):
    """A worker process died: killed by a signal or exited.

    Attributes: ``worker_id``, ``pid``, ``signal`` (a name such as ``"SIGKILL"``, or None),
    ``exit_code`` (or None when a signal killed it), ``cause`` (in words), ``indices`` (the
    dataset indices it was loading: the one it died on when known, else every index of the
    batches it had in flight).
    """

    def __init__(self, message, *, worker_id=None, pid=None, signal=None, exit_code=None,
                 cause=None, indices=()):
        super().__init__(message)
        self.worker_id = worker_id
        self.pid = pid
        self.signal = signal
        self.exit_code = exit_code
        self.cause = cause
        self.indices = list(indices)

    def __reduce__(self):
        return (_rebuild_crashed, (self.args[0], self.__dict__))


def _rebuild_crashed(message, state):
    exc = WorkerCrashed(message)
    exc.__dict__.update(state)
    return exc


class WorkerHung(WorkerError):
    """A worker made no progress in time. ``worker_id``, ``pid``, ``index`` (the dataset index
    it was loading, when known) and ``stack`` (its Python stack, from the worker itself)."""

    def __init__(self, message, *, worker_id=None, pid=None, index=None, stack=""):
        super().__init__(message)
        self.worker_id = worker_id
        self.pid = pid
        self.index = index
        self.stack = stack

    def __reduce__(self):
        return (_rebuild_hung, (self.args[0], self.__dict__))


def _rebuild_hung(message, state):
    exc = WorkerHung(message)
    exc.__dict__.update(state)
    return exc


class StateMismatchError(ValueError):
    """``load_state_dict`` got a state that this loader cannot resume from: another version, or
    a loader that orders its samples differently (the message names what differs)."""
