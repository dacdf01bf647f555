"""stoker.SharedList: a flat, read-only list whose pages workers share."""

from __future__ import annotations

import pickle

import pytest

import stoker


def test_items_round_trip_and_behave_like_a_sequence():
    items = [{"path": "/d/7.jpg", "label": 1}, None, 3.5, "x" * 1000, (1, [2, 3])]
    sl = stoker.SharedList(items)
    assert len(sl) == 5 and list(sl) == items and sl[-1] == (1, [2, 3]) and sl[1:3] == [None, 3.5]
    with pytest.raises(IndexError):
        sl[5]
    assert stoker.SharedList([]).__len__() == 0


def test_spawned_workers_map_the_same_memory(scenario):
    r = scenario("shared_list.spawned_workers_map_the_same_memory", timeout=120)
    assert "OK" in r.stdout, r.stdout + r.stderr


def test_reading_does_not_grow_a_forked_workers_memory(scenario):
    r = scenario("shared_list.reading_does_not_grow_a_forked_child", timeout=120)
    assert "OK" in r.stdout, r.stdout + r.stderr


def test_pickling_outside_a_worker_start_still_works():
    sl = stoker.SharedList([1, 2, 3])
    assert list(pickle.loads(pickle.dumps(sl))) == [1, 2, 3]
