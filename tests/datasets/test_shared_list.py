"""stoker.SharedList: a flat, read-only list whose pages workers share."""

from __future__ import annotations

import pickle

import pytest

import stoker
from support.scenarios import run_ok


@pytest.mark.unit
def test_items_round_trip_and_behave_like_a_sequence():
    items = [{"path": "/d/7.jpg", "label": 1}, None, 3.5, "x" * 1000, (1, [2, 3])]
    sl = stoker.SharedList(items)
    assert len(sl) == 5 and list(sl) == items and sl[-1] == (1, [2, 3]) and sl[1:3] == [None, 3.5]
    with pytest.raises(IndexError):
        sl[5]
    assert stoker.SharedList([]).__len__() == 0


def test_spawned_workers_map_the_same_memory():
    run_ok("shared_list.spawned_workers_map_the_same_memory", timeout=120)


def test_reading_does_not_grow_a_forked_workers_memory():
    run_ok("shared_list.reading_does_not_grow_a_forked_child", timeout=120)


@pytest.mark.unit
def test_pickling_outside_a_worker_start_still_works():
    sl = stoker.SharedList([1, 2, 3])
    assert list(pickle.loads(pickle.dumps(sl))) == [1, 2, 3]


class _Point:
    def __init__(self, x):
        self.x = x

    def __eq__(self, other):
        return isinstance(other, _Point) and other.x == self.x


@pytest.mark.unit
def test_every_shape_comes_back_equal_and_of_its_type():
    """What the engine lays out (dicts with str keys, lists, tuples, str, bytes, ints, floats,
    bools, None, nested) and what it pickles in place (a class of its own, a big int, a str
    pickle alone can carry, a dict with int keys, a subclass) all come back equal, of the same
    types, as fresh objects."""
    import collections
    import math

    items = [
        {"path": "/data/train/0000001.jpg", "label": 7, "size": 1977},
        {"path": "/data/train/0000002.jpg", "label": 8, "size": 1978},  # (the same keys)
        {"b": b"\x00\xff", "f": -2.5, "t": True, "n": None, "l": [1, "x", [2.0]],
         "u": (1, (2,)), "d": {"inner": {"deeper": [{}]}}},
        {"big": 2**70, "neg": -(2**63), "nan": math.nan, "inf": -math.inf},
        {1: "int key", "s": "mixed keys: pickled whole"},
        {"point": _Point(3), "od": collections.OrderedDict(a=1), "surrogate": "\udcff"},
        [], (), "", b"", 0, -1, 2**63 - 1, 1.5, True, False, None,
        collections.Counter("abc"), _Point([1, 2]), [[[[["deep"]]]]], "ünïcødé ✓",
    ]
    sl = stoker.SharedList(items)
    assert len(sl) == len(items)
    for got, want in zip(sl, items):
        if isinstance(want, dict) and "nan" in want:
            assert math.isnan(got["nan"]) and got["inf"] == -math.inf and got["big"] == 2**70
            continue
        assert got == want and type(got) is type(want), (got, want)
    a, b = sl[0], sl[0]
    assert a == b and a is not b  # fresh each time: the caller may change it
    deep = sl[2]
    assert type(deep["u"]) is tuple and type(deep["u"][1]) is tuple
    assert type(sl[5]["od"]) is collections.OrderedDict


@pytest.mark.unit
def test_a_list_of_a_million_records_is_compact_and_read_without_pickle():
    records = ({"path": f"/data/{k:07d}.jpg", "label": k % 1000, "size": 1000 + k % 977}
               for k in range(1_000_000))
    sl = stoker.SharedList(records)
    assert sl[123_456] == {"path": "/data/0123456.jpg", "label": 456, "size": 1000 + 123456 % 977}
    # the keys are written once, not per item: about 40 bytes a record
    assert sl.nbytes < 60 * 1_000_000, sl.nbytes
    assert sl[-1]["label"] == 999 and sl[999_999]["path"].endswith("0999999.jpg")


@pytest.mark.unit
def test_a_corrupt_buffer_raises_instead_of_reading_past_it():
    sl = stoker.SharedList([{"a": "x" * 100}, [1, 2, 3]])
    raw = bytearray(sl._map)
    text = raw.index(b"x" * 100)
    raw[text - 4:text] = b"\xff" * 4  # the string's length, past the end of the buffer
    with pytest.raises(ValueError, match="corrupt"):
        list(stoker.datasets.shared_list._from_buffer(bytes(raw)))
    raw = bytearray(sl._map)
    start = len(raw) - len(pickle.dumps([("a",)], protocol=5))  # the schemas, kept
    raw[start - 30:start - 1] = b"l" + b"\xff" * 28  # a list claiming 4 billion items
    with pytest.raises(ValueError, match="corrupt"):
        list(stoker.datasets.shared_list._from_buffer(bytes(raw)))


@pytest.mark.unit
@pytest.mark.parametrize("offsets_at, count", [(2**63 - 8, 0), (48, 2**61), (-5, 1)])
def test_a_header_that_does_not_fit_its_buffer_raises(offsets_at, count):
    from stoker.datasets import shared_list as _shared_list

    raw = bytearray(stoker.SharedList([{"a": 1}])._map)
    magic, _, _, data_at, schema_at, schema_len = _shared_list._HEADER.unpack_from(raw, 0)
    _shared_list._HEADER.pack_into(raw, 0, magic, count, offsets_at, data_at, schema_at,
                                   schema_len)
    with pytest.raises(ValueError, match="does not fit"):
        _shared_list._from_buffer(bytes(raw))


@pytest.mark.unit
def test_it_is_a_sequence_with_slices_and_search():
    from collections.abc import Sequence

    sl = stoker.SharedList(range(10))
    assert isinstance(sl, Sequence) and sl[2:8:3] == [2, 5] and sl[::-4] == [9, 5, 1]
    assert sl.index(7) == 7 and sl.count(3) == 1 and 4 in sl and list(reversed(sl))[0] == 9
    with pytest.raises(ValueError):
        sl.index(42)
    assert repr(sl).startswith("SharedList(10 items")
