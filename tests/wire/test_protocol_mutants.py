"""stoker.wire.protocol: what travels between the main process and a worker beyond the C++
engine's messages (tasks, resumes, error reports, skips, stream states)."""

from __future__ import annotations

import pickle
import traceback
from array import array

import numpy as np
import pytest

from stoker import _stoker
from stoker.wire import protocol as p

pytestmark = pytest.mark.unit  # no process (tests/support/tiers.py)


def test_the_constants_are_the_engines():
    for name in ("MSG_TASK", "MSG_RESUME", "MSG_STOP", "MSG_LIMIT", "MSG_BATCH", "MSG_ERROR",
                 "MSG_END", "MSG_RESUMED", "MSG_LOG_FILE", "MSG_SKIPPED", "MSG_ITER_STATE",
                 "LOG_CRASH", "LOG_STDERR", "STATE_IDLE", "STATE_FETCHING", "STATE_COLLATING",
                 "STATE_ENCODING", "STATE_STARTING", "MODE_COLLATE", "MODE_CONVERT",
                 "MODE_AS_IS"):
        assert getattr(p, name) == getattr(_stoker, name), name


def test_a_list_of_plain_ints_travels_as_int64():
    fmt, payload = p.encode_index([3, -1, 2**62, 0])
    assert fmt == 0 and payload == array("q", [3, -1, 2**62, 0]).tobytes()
    assert p.decode_index(fmt, payload) == [3, -1, 2**62, 0]
    assert p.encode_index([]) == (0, b"")
    assert p.decode_index(0, b"") == []


@pytest.mark.parametrize("index", [
    (1, 2),  # a tuple
    7,  # one index
    [True, 1],  # bools keep their type
    [np.int64(3)],
    [1, "a"],
    [2**63],  # past int64
    [-(2**63) - 1],
    "key",
    [[1, 2]],
])
def test_anything_else_is_pickled_with_its_types(index):
    fmt, payload = p.encode_index(index)
    assert fmt == 1
    assert payload == pickle.dumps(index, protocol=pickle.HIGHEST_PROTOCOL)
    back = p.decode_index(fmt, payload)
    assert back == index and type(back) is type(index)
    if isinstance(index, list):
        assert [type(x) for x in back] == [type(x) for x in index]


class _List(list):
    pass


def test_a_list_subclass_is_pickled():
    fmt, payload = p.encode_index(_List([1, 2]))
    assert fmt == 1 and type(p.decode_index(fmt, payload)) is _List


def test_int64_bounds_travel_as_int64():
    for edge in (2**63 - 1, -(2**63)):
        fmt, payload = p.encode_index([edge])
        assert fmt == 0 and p.decode_index(fmt, payload) == [edge]


def test_a_task_decodes_to_its_index_and_serial_word():
    fmt, payload = p.encode_index((1, 2))
    assert p.decode_task(fmt, 1, payload) == ((1, 2), True)
    assert p.decode_task(0, 0, array("q", [4]).tobytes()) == ([4], False)
    with pytest.raises(ValueError):
        p.decode_task(1 | 1024, 0, pickle.dumps("x"))  # (no other bits: tests/worker/)


def test_a_resume_round_trips():
    payload = p.encode_resume(5, 9, {0: {"position": 3}})
    assert p.decode_resume(payload) == (5, 9, {0: {"position": 3}})
    assert p.decode_resume(p.encode_resume(5, None)) == (5, None, {})
    assert p.decode_resume(p.encode_resume(5, None, None)) == (5, None, {})
    assert p.decode_resume(p.encode_resume(-1, 0, {})) == (-1, 0, {})
    assert payload == pickle.dumps((5, 9, {0: {"position": 3}}))


def test_stream_states_and_skips_round_trip():
    state = {"position": 4, "dataset": {"a": [1, 2]}}
    payload = p.encode_stream_state(state)
    assert payload == pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    assert p.decode_stream_state(payload) == state
    recs = [(3, "bad"), ("k", "worse")]
    payload = p.encode_skipped(iter(recs))
    assert payload == pickle.dumps(recs)
    assert p.decode_skipped(payload) == recs


def _raise(exc):
    try:
        raise exc
    except BaseException as e:
        return e


def test_an_error_report_keeps_a_type_found_by_name():
    e = _raise(ValueError("bad sample"))
    report = p.decode_error(p.encode_error(e, 2, [1, 2]))
    assert report == {
        "type": ValueError,
        "type_name": "builtins.ValueError",
        "message": "bad sample",
        "traceback": "".join(traceback.format_exception(type(e), e, e.__traceback__)),
        "worker_id": 2,
        "index": [1, 2],
    }
    assert report["traceback"].startswith("Traceback (most recent call last):\n")
    assert report["traceback"].endswith("ValueError: bad sample\n")
    assert "_raise" in report["traceback"]


class ModuleLevelError(Exception):
    pass


def test_an_error_of_a_tests_own_class_keeps_it():
    report = p.decode_error(p.encode_error(_raise(ModuleLevelError("m")), 0, 1))
    assert report["type"] is ModuleLevelError
    assert report["type_name"] == f"{__name__}.ModuleLevelError"


def test_a_chained_error_keeps_its_chain_in_the_traceback():
    try:
        try:
            raise KeyError("inner")
        except KeyError as inner:
            raise RuntimeError("outer") from inner
    except RuntimeError as e:
        report = p.decode_error(p.encode_error(e, 0, None))
    assert "KeyError: 'inner'" in report["traceback"]
    assert "direct cause" in report["traceback"]
    assert report["traceback"].endswith("RuntimeError: outer\n")


def test_an_index_that_does_not_pickle_goes_as_its_repr():
    class NoPickle:
        def __reduce__(self):
            raise TypeError("no")

        def __repr__(self):
            return "NoPickle(7)"

    report = p.decode_error(p.encode_error(_raise(ValueError("x")), 1, NoPickle()))
    assert report["index"] == "NoPickle(7)" and report["type"] is ValueError
    assert report["message"] == "x" and report["worker_id"] == 1


def _deeper(exc):
    def inner():
        raise exc

    try:
        inner()
    except BaseException as e:
        return e


def test_a_traceback_that_cannot_be_formatted_falls_back_to_the_frames(monkeypatch):
    e = _deeper(ValueError("v"))

    def fail(*a, **k):
        raise RuntimeError("no format")

    monkeypatch.setattr(p.traceback, "format_exception", fail)
    frames = "".join(traceback.format_tb(e.__traceback__))
    assert len(traceback.format_tb(e.__traceback__)) == 2
    text = p._traceback_text(e, "my.Type")
    assert text == f"Traceback (most recent call last):\n{frames}my.Type: v\n"
    monkeypatch.setattr(p.traceback, "format_tb", fail)
    assert p._traceback_text(e, "my.Type") == (
        "my.Type: v (its traceback could not be formatted)\n")
    report = p.decode_error(p.encode_error(e, 0, 0))
    assert report["traceback"] == ("builtins.ValueError: v (its traceback could not be "
                                   "formatted)\n")


class _BadStr(Exception):
    def __str__(self):
        raise ValueError("no str")


def test_safe_str():
    assert p.safe_str(ValueError("plain")) == "plain"
    assert p.safe_str(_BadStr(1, "a")) == "<exception str() failed; args: (1, 'a')>"

    class NoArgs(_BadStr):
        @property
        def args(self):
            raise RuntimeError("no args")

    assert p.safe_str(NoArgs()) == "<exception str() failed>"


def test_a_traceback_of_an_unprintable_error_in_the_fallback(monkeypatch):
    e = _raise(_BadStr(3))

    def fail(*a, **k):
        raise RuntimeError("no format")

    monkeypatch.setattr(p.traceback, "format_exception", fail)
    frames = "".join(traceback.format_tb(e.__traceback__))
    assert p._traceback_text(e, "T") == (
        f"Traceback (most recent call last):\n{frames}T: <exception str() failed; args: (3,)>\n")
    monkeypatch.setattr(p.traceback, "format_tb", fail)
    assert p._traceback_text(e, "T") == (
        "T: <exception str() failed; args: (3,)> (its traceback could not be formatted)\n")


class _Named:
    """Stands for a class: only the attributes a test gives it."""

    def __init__(self, **attrs):
        for k, v in attrs.items():
            object.__setattr__(self, k, v)

    def __getattribute__(self, name):
        d = object.__getattribute__(self, "__dict__")
        if name in d:
            return d[name]
        raise AttributeError(name)


def test_type_names():
    assert p._type_name(ValueError) == "builtins.ValueError"
    assert p._type_name(ModuleLevelError) == f"{__name__}.ModuleLevelError"
    assert p._type_name(_Named(__module__="m", __qualname__="A.B", __name__="B")) == "m.A.B"
    assert p._type_name(_Named(__module__="m", __name__="B")) == "m.B"
    assert p._type_name(_Named(__module__="m", __qualname__="", __name__="B")) == "m.B"
    assert p._type_name(_Named(__module__="m")) == "m.?"
    assert p._type_name(_Named(__qualname__="Q")) == "Q"
    assert p._type_name(_Named(__module__="", __qualname__="Q")) == "Q"
    assert p._type_name(_Named(__module__=5, __qualname__="Q")) == "Q"
    assert p._type_name(_Named(__module__=None, __qualname__=7)) == "7"
    assert p._type_name(_Named()) == "?"


def test_safe_and_short_reprs():
    class NoRepr:
        def __repr__(self):
            raise TypeError("no")

    assert p._safe_repr([1, "a"]) == "[1, 'a']"
    assert p._safe_repr(NoRepr()) == (f"<{__name__}.test_safe_and_short_reprs.<locals>.NoRepr "
                                      "object (repr() failed)>")
    assert p.short_repr("x" * 10) == repr("x" * 10)
    s = "y" * 198  # repr: 200 characters
    assert p.short_repr(s) == repr(s)
    long = "z" * 199  # repr: 201
    assert p.short_repr(long) == repr(long)[:197] + "..." and len(p.short_repr(long)) == 200
    assert p.short_repr("abcdefgh", limit=6) == "'ab..."
    assert p.short_repr("abcd", limit=6) == "'abcd'"
    assert p.short_repr(NoRepr()).endswith("object (repr() failed)>")


def test_an_error_of_a_type_that_does_not_pickle_goes_without_its_type():
    def make():
        class Local(Exception):
            pass

        return Local

    local = make()
    report = p.decode_error(p.encode_error(_raise(local("l")), 4, [0]))
    assert report["type"] is None
    assert report["type_name"].endswith("make.<locals>.Local")
    assert report["message"] == "l" and report["index"] == [0] and report["worker_id"] == 4
