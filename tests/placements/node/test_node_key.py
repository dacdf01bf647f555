"""The node pool's group key (placements/node/hello.py): ranks share workers only when nothing
that changes what or how a worker loads differs. Pure: a memfd, no process."""

from __future__ import annotations

import dataclasses

import pytest

from stoker.config.load import LoadSettings
from stoker.placements.node import hello
from stoker.wire.sealed import Sealed
from stoker.worker.loop import WorkerConfig

pytestmark = pytest.mark.unit  # no process (tests/support/tiers.py)


def config(**changes) -> WorkerConfig:
    base = WorkerConfig(num_workers=2, kind=0, dataset=list(range(8)), auto_collation=True,
                        collate_fn=None, collate_mode=0, drop_last=False, base_seed=1)
    return dataclasses.replace(base, **changes)


def key(c: WorkerConfig) -> str:
    sealed = Sealed((c.dataset, c.collate_fn, c.init_fn))
    try:
        return hello.group_key(c, sealed)[0]
    finally:
        sealed.close()


def threads(n) -> LoadSettings:
    return LoadSettings(threads=n)


def test_threads_per_worker_is_in_the_key():
    assert key(config(load=threads(1))) != key(config(load=threads(8)))
    assert key(config(load=threads(8))) != key(config(load=threads("auto")))
    assert key(config(load=threads(8))) == key(config(load=threads(8)))
    assert key(config(load=LoadSettings("skip"))) != key(config())
    assert key(config(load=LoadSettings("retry", 7))) != key(config(load=LoadSettings("retry")))


def test_every_field_is_keyed_or_named_with_a_reason():
    names = {f.name for f in dataclasses.fields(WorkerConfig)}
    assert set(hello.NOT_KEYED) <= names, set(hello.NOT_KEYED) - names
    assert all(reason.strip() for reason in hello.NOT_KEYED.values())
    keyed = {name for name, _ in hello.keyed_settings(config())}
    assert keyed == names - set(hello.NOT_KEYED)
    assert {"load", "drop_last", "kind",
            "auto_collation", "collate_mode", "shared_seed"} <= keyed


def test_a_change_of_any_keyed_setting_gives_another_group():
    changed = {"kind": 1, "auto_collation": False, "collate_mode": 1, "drop_last": True,
               "load": LoadSettings("retry", 7, 4), "shared_seed": 5}
    keyed = {name for name, _ in hello.keyed_settings(config())}
    assert keyed == set(changed), "a new keyed field: add a change of it here"
    same = key(config())
    for name, value in changed.items():
        assert key(config(**{name: value})) != same, name
    for name in hello.NOT_KEYED:  # what stays out: the same group
        if name in ("dataset", "collate_fn", "init_fn"):
            continue  # (in the pickle: tested by the node suite)
        other = {"num_workers": 5, "base_seed": 99, "shared_memory_share": 1 << 20,
                 "stream_states": {0: {"x": 1}}, "prepare": {"sys_path": ["/x"]},
                 "stdio": (1, 2), "seeder": None}[name]
        assert key(config(**{name: other})) == same, name
