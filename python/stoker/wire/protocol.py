"""What travels between the main process and a worker, beyond what the C++ engine defines.

Message types, log kinds, worker states and collate modes are the C++ definitions, exported by
the extension (one source for both languages). Payloads:

- a task: a batch of plain ints travels as int64 (no pickle on the hot path); anything else a
  sampler can yield (strings, tuples, tensors) is pickled, so the dataset receives exactly the
  objects the sampler produced, as with torch. The message's word `a` says which; its word `b`
  is ``serial`` (1: load the samples one at a time, whatever threads_per_worker says: a task
  re-issued after its worker died with several of its samples in flight, so that the next
  death names the sample that caused it). ``decode_task`` gives a ``Task``;
- a new epoch (RESUME): the base seed, an IterDataPipe's shared seed, the states a resumed
  stateful stream restores;
- an error report, a list of skipped samples: pickled plain data.

Pure functions, safe from any thread; the same in every placement.
"""

from __future__ import annotations

import pickle
import traceback
from array import array
from typing import NamedTuple

from .. import _stoker
from ..pickling import by_value as _by_value
from ..pickling import pickler as _pickling

MSG_TASK = _stoker.MSG_TASK
MSG_RESUME = _stoker.MSG_RESUME
MSG_STOP = _stoker.MSG_STOP
MSG_LIMIT = _stoker.MSG_LIMIT
MSG_BATCH = _stoker.MSG_BATCH
MSG_ERROR = _stoker.MSG_ERROR
MSG_END = _stoker.MSG_END
MSG_RESUMED = _stoker.MSG_RESUMED
MSG_LOG_FILE = _stoker.MSG_LOG_FILE
MSG_SKIPPED = _stoker.MSG_SKIPPED
MSG_ITER_STATE = _stoker.MSG_ITER_STATE

LOG_CRASH = _stoker.LOG_CRASH
LOG_STDERR = _stoker.LOG_STDERR
STATE_IDLE = _stoker.STATE_IDLE
STATE_FETCHING = _stoker.STATE_FETCHING
STATE_COLLATING = _stoker.STATE_COLLATING
STATE_ENCODING = _stoker.STATE_ENCODING
STATE_STARTING = _stoker.STATE_STARTING

MODE_COLLATE = _stoker.MODE_COLLATE
MODE_CONVERT = _stoker.MODE_CONVERT
MODE_AS_IS = _stoker.MODE_AS_IS

_INDEX_INT64 = 0
_INDEX_PICKLED = 1
_PLAIN_INT = frozenset((int,))  # bool, numpy ints... travel pickled, with their types


def encode_index(index) -> tuple[int, bytes]:
    """(format, payload) for what the sampler yielded: a list of indices or one index."""
    # set(map(type, ...)) runs at C speed (a generator over the batch cost ~6 us per batch of
    # 64); array() raises OverflowError outside int64.
    if type(index) is list and set(map(type, index)) <= _PLAIN_INT:
        try:
            return _INDEX_INT64, array("q", index).tobytes()
        except OverflowError:
            pass
    return _INDEX_PICKLED, pickle.dumps(index, protocol=pickle.HIGHEST_PROTOCOL)


class Task(NamedTuple):
    """A task message as a worker reads it: what the sampler yielded, and whether its samples
    load one at a time (``serial``, the message's word `b`)."""

    index: object  # type: ignore[assignment]  # (shadows tuple.index: no one calls it here)
    serial: bool = False


def decode_task(fmt: int, serial: int, payload: bytes) -> Task:
    """The ``Task`` of a task message's words `a` (`fmt`, from ``encode_index``) and `b`."""
    return Task(decode_index(fmt, payload), bool(serial))


def decode_index(fmt: int, payload: bytes):
    if fmt == _INDEX_INT64:
        a = array("q")
        a.frombytes(payload)
        return a.tolist()
    if fmt == _INDEX_PICKLED:
        return pickle.loads(payload)
    raise ValueError(f"stoker: a task's index format is {_INDEX_INT64} or {_INDEX_PICKLED}, "
                     f"not {fmt}")


def encode_resume(base_seed: int, shared_seed: int | None, stream_states=None) -> bytes:
    """What a new epoch's RESUME tells persistent workers (its number travels as the task);
    `stream_states`: {worker id: state (plain data)} of a stateful IterableDataset being
    resumed."""
    return pickle.dumps((base_seed, shared_seed, stream_states or {}))


def decode_resume(payload: bytes) -> tuple[int, int | None, dict]:
    return pickle.loads(payload)


def encode_error(exc: BaseException, worker_id: int, index) -> bytes:
    """A picklable report of an exception raised in a worker (type kept when picklable).

    Never raises for a strange exception: its __str__, its traceback's frames, its type's
    pickling and the index's repr may each fail, and the report still goes out with what could
    be read, so the main process names the failure instead of seeing the worker die.
    """
    exc_type = type(exc)
    type_name = _type_name(exc_type)
    try:
        # (a class the main process sent by value goes back by value: ``except`` it there)
        data = _pickling.dumps(exc_type)
        if not _by_value.needed(exc_type, to_worker=False):
            pickle.loads(data)
    except Exception:
        exc_type = None
    report = {
        "type": exc_type,
        "type_name": type_name,
        "message": safe_str(exc),
        "traceback": _traceback_text(exc, type_name),
        "worker_id": worker_id,
        "index": index,
    }
    try:
        return _pickling.dumps(report)
    except Exception:
        report["index"] = _safe_repr(index)
        return _pickling.dumps(report)


def safe_str(exc: BaseException) -> str:
    """str(exc), or what can be said about exc when its __str__ raises."""
    try:
        return str(exc)
    except Exception:
        pass
    try:
        return f"<exception str() failed; args: {_safe_repr(exc.args)}>"
    except Exception:
        return "<exception str() failed>"


def _type_name(cls) -> str:
    module = getattr(cls, "__module__", None)
    name = getattr(cls, "__qualname__", None) or getattr(cls, "__name__", None) or "?"
    return f"{module}.{name}" if isinstance(module, str) and module else str(name)


def _traceback_text(exc: BaseException, type_name: str) -> str:
    try:
        return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    except Exception:
        pass
    try:  # the frames alone, when the exception's own text is what fails
        frames = "".join(traceback.format_tb(exc.__traceback__))
        return f"Traceback (most recent call last):\n{frames}{type_name}: {safe_str(exc)}\n"
    except Exception:
        return f"{type_name}: {safe_str(exc)} (its traceback could not be formatted)\n"


def _safe_repr(obj) -> str:
    try:
        return repr(obj)
    except Exception:
        return f"<{_type_name(type(obj))} object (repr() failed)>"


def decode_error(payload: bytes) -> dict:
    return pickle.loads(payload)


def encode_stream_state(state: dict) -> bytes:
    """A stateful stream's state (plain data, ``common.plain``) from a worker to the main process."""
    return pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)


def decode_stream_state(payload: bytes) -> dict:
    return pickle.loads(payload)


def encode_skipped(records) -> bytes:
    """[(dataset index, reason)] of the samples a task skipped."""
    return pickle.dumps([(i, r) for i, r in records])


def decode_skipped(payload: bytes) -> list:
    return pickle.loads(payload)


def short_repr(obj, limit: int = 200) -> str:
    r = _safe_repr(obj)
    return r if len(r) <= limit else r[: limit - 3] + "..."

