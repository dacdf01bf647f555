"""What travels on a worker's control channel, beyond what the C++ engine defines.

Task payloads: a batch of plain ints travels as int64 (no pickle on the hot path); anything else
a sampler can yield (strings, tuples, tensors) is pickled, so the dataset receives exactly the
objects the sampler produced, as with torch. Error reports are pickled dicts.
"""

from __future__ import annotations

import pickle
import traceback
from array import array

from . import _stoker

MSG_TASK = _stoker.MSG_TASK
MSG_RESUME = _stoker.MSG_RESUME
MSG_STOP = _stoker.MSG_STOP
MSG_BATCH = _stoker.MSG_BATCH
MSG_ERROR = _stoker.MSG_ERROR
MSG_END = _stoker.MSG_END
MSG_RESUMED = _stoker.MSG_RESUMED
MSG_LOG_FILE = _stoker.MSG_LOG_FILE
MSG_SKIPPED = _stoker.MSG_SKIPPED

LOG_CRASH = _stoker.LOG_CRASH
LOG_STDERR = _stoker.LOG_STDERR
STATE_IDLE = _stoker.STATE_IDLE
STATE_FETCHING = _stoker.STATE_FETCHING
STATE_COLLATING = _stoker.STATE_COLLATING
STATE_ENCODING = _stoker.STATE_ENCODING

MODE_COLLATE = _stoker.MODE_COLLATE
MODE_CONVERT = _stoker.MODE_CONVERT
MODE_AS_IS = _stoker.MODE_AS_IS

_INDEX_INT64 = 0
_INDEX_PICKLED = 1
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1


def encode_index(index) -> tuple[int, bytes]:
    """(format, payload) for what the sampler yielded: a list of indices or one index."""
    if type(index) is list and all(type(i) is int and _I64_MIN <= i <= _I64_MAX for i in index):
        return _INDEX_INT64, array("q", index).tobytes()
    return _INDEX_PICKLED, pickle.dumps(index, protocol=pickle.HIGHEST_PROTOCOL)


def decode_index(fmt: int, payload: bytes):
    if fmt == _INDEX_INT64:
        a = array("q")
        a.frombytes(payload)
        return a.tolist()
    return pickle.loads(payload)


def encode_error(exc: BaseException, worker_id: int, index) -> bytes:
    """A picklable report of an exception raised in a worker (type kept when picklable)."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    exc_type = type(exc)
    try:
        pickle.loads(pickle.dumps(exc_type))
    except Exception:
        exc_type = None
    report = {
        "type": exc_type,
        "type_name": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "message": str(exc),
        "traceback": tb,
        "worker_id": worker_id,
        "index": index,
    }
    try:
        return pickle.dumps(report, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        report["index"] = repr(index)
        return pickle.dumps(report, protocol=pickle.HIGHEST_PROTOCOL)


def decode_error(payload: bytes) -> dict:
    return pickle.loads(payload)


def short_repr(obj, limit: int = 200) -> str:
    r = repr(obj)
    return r if len(r) <= limit else r[: limit - 3] + "..."

