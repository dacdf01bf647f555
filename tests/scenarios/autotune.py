"""Scenario of tests/loader/autotune/test_autotune.py: worker deaths under a scripted tuner, in a fresh process
(it patches the tuner's class and the usable CPUs)."""

from __future__ import annotations

import gc
import itertools
import tempfile

import torch

import stoker
from scenario_datasets import KillsOnceAt
from stoker.common import system as _cgroup
from stoker.loader.autotune import measure as _measure
from stoker.loader.autotune import tuner as _autotune


def deaths_while_the_tuner_changes_its_mind(steps, depth):
    """Three SIGKILLs under a tuner cycling through `steps` leave two epochs as a fixed loader's."""
    _cgroup.usable_cpus = lambda: 3
    _measure.WINDOW_S = 0.0
    script = itertools.cycle(steps)  # a step: a worker count, or a [count, depth] pair

    def decide(self, window, batch):
        step = next(script)
        if isinstance(step, list):
            self.active, self.depth = step
        else:
            self.active = step
        return self.active

    _autotune.Tuner.decide = decide
    loader = stoker.DataLoader(KillsOnceAt(bad=[5, 37, 90], marks=tempfile.mkdtemp(), n=120),
                               batch_size=4, shuffle=True, num_workers="auto",
                               prefetch_factor=depth, persistent_workers=True,
                               generator=torch.Generator().manual_seed(1))
    ref = stoker.DataLoader(KillsOnceAt(bad=[], marks="", n=120), batch_size=4, shuffle=True,
                            num_workers=2, persistent_workers=True,
                            generator=torch.Generator().manual_seed(1))
    for epoch in range(2):
        got = [b[1].tolist() for b in loader]
        assert got == [b[1].tolist() for b in ref], epoch
    assert len(loader.deaths) == 3, loader.deaths
    assert {d.index for d in loader.deaths} == {5, 37, 90}, loader.deaths
    del loader
    gc.collect()


def a_rank_under_auto(out_path):
    """One rank of a job (the test sets LOCAL_WORLD_SIZE): a loader with num_workers="auto"
    runs an epoch; writes its bound and the worker processes it started."""
    import json

    from scenario_datasets import Slow

    dl = stoker.DataLoader(Slow(64), batch_size=4, num_workers="auto")
    pids = set()
    for _ in dl:
        pids.update(w["pid"] for w in dl.stats()["workers"] if w["pid"])
    with open(out_path, "w") as f:
        json.dump({"num_workers": dl.num_workers, "started": len(pids),
                   "rank_cpus": _cgroup.rank_cpus(), "usable_cpus": _cgroup.usable_cpus()}, f)
