"""How a worker loads (config/load.py): one frozen record, made once from Options in the
training process, carried whole in WorkerConfig. No process."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from stoker.config.load import LoadSettings
from stoker.config.options import Options
from stoker.worker.loop import WorkerConfig

pytestmark = pytest.mark.unit


class Plain:
    def __getitem__(self, i):
        return i


class Async:
    async def __getitem__(self, i):
        return i


def test_made_from_options_with_threads_resolved_for_the_dataset():
    o = Options(on_error="retry", max_retries=5, threads_per_worker=16)
    assert LoadSettings.of(o, Plain()) == LoadSettings("retry", 5, 16)
    assert LoadSettings.of(Options(), Plain()) == LoadSettings("raise", 3, 1)
    assert LoadSettings.of(Options(), Async()).threads == "auto"  # unset, async: "auto"
    assert LoadSettings.of(Options(threads_per_worker=2), Async()).threads == 2
    assert LoadSettings.of(Options(threads_per_worker="auto"), Plain()).threads == "auto"


def test_every_field_comes_from_an_option_or_the_placement():
    """A field added here is read from Options by ``of``, or given to it (nothing carried beside
    it): ``cpus``, each worker's share of the CPUs, is the placement's."""
    o = Options(on_error="skip", max_retries=0, threads_per_worker=3)
    made = LoadSettings.of(o, Plain(), cpus=4)
    assert {f.name for f in dataclasses.fields(LoadSettings)} == {"on_error", "max_retries",
                                                                  "threads", "cpus"}
    assert (made.on_error, made.max_retries, made.threads, made.cpus) == ("skip", 0, 3, 4)
    assert LoadSettings.of(o, Plain()).cpus == 1 and LoadSettings.of(o, Plain(), 0).cpus == 1


def test_cpus_is_a_count():
    for bad in (0, -1, True, 1.5, "2", None):
        with pytest.raises(ValueError, match="cpus"):
            LoadSettings(cpus=bad)
    assert LoadSettings(cpus=64).cpus == 64


def test_a_record_pickled_before_cpus_existed_loads_with_one():
    """A LoadSettings pickled by a stoker without the field (its state: the fields it had) loads
    with the default: what such a worker was given before."""
    old = LoadSettings.__new__(LoadSettings)
    object.__setattr__(old, "__dict__", {"on_error": "skip", "max_retries": 2, "threads": 4})
    back = pickle.loads(pickle.dumps(old))
    assert (back.on_error, back.max_retries, back.threads, back.cpus) == ("skip", 2, 4, 1)
    assert back == LoadSettings("skip", 2, 4)


def test_frozen_and_checked():
    s = LoadSettings("skip", 2, 4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.threads = 8  # type: ignore[misc]
    with pytest.raises(ValueError, match="resolved"):
        LoadSettings(threads=None)
    with pytest.raises(ValueError, match="resolved"):
        LoadSettings(threads=True)  # (a bool is an int to isinstance, not a count)
    with pytest.raises(ValueError, match="on_error"):
        LoadSettings(on_error="ignore")
    assert LoadSettings("retry", 4).retries == 4 and LoadSettings("skip", 4).retries == 0


def test_pickles_whole_inside_the_worker_config():
    s = LoadSettings("retry", 7, "auto")
    assert pickle.loads(pickle.dumps(s)) == s and hash(pickle.loads(pickle.dumps(s))) == hash(s)
    c = WorkerConfig(num_workers=2, kind=0, dataset=[1, 2], auto_collation=True, collate_fn=None,
                     collate_mode=0, drop_last=False, base_seed=1, load=s)
    back = pickle.loads(pickle.dumps(c))
    assert back.load == s and type(back.load) is LoadSettings
    names = {f.name for f in dataclasses.fields(WorkerConfig)}
    assert not names & {"on_error", "max_retries", "threads_per_worker"}  # one value, not three
    assert WorkerConfig(num_workers=1, kind=0, dataset=[], auto_collation=True, collate_fn=None,
                        collate_mode=0, drop_last=False, base_seed=0).load == LoadSettings()
