"""Integrations, run for real on CPU: Lightning (single, DDP with 2 processes on gloo,
ddp_spawn), accelerate's prepare() (1 process, and 2 under torchrun + `stoker run`), the
transformers Trainer (with resume), Hugging Face datasets, webdataset, torchdata.

Each proves two things that cannot pass under plain torch: every sample was loaded by a stoker
worker (``stoker.get_worker_info()`` is set only there), and stoker's options reached the loader
the framework built (a corrupt sample is skipped by ``on_error="skip"`` instead of ending the
run). ``make test`` installs the libraries (requirements-frameworks.txt); a test is skipped, with
the reason, only where its library cannot be imported. Scripts live in tests/frameworks/.
"""

from __future__ import annotations

import json
import os

import pytest

from framework_data import BAD
from support.frameworks import SCRIPTS, needs, reports, run

ALL = set(range(16))


def check_ranks(reps, ranks, served_by):
    assert len(reps) == ranks, reps
    seen = set()
    for rep in reps:
        assert rep["engine"] == [1], rep  # every sample came from a stoker worker
        assert rep["served_by"] == served_by, rep
        seen |= set(rep["idx"])
    assert seen == ALL - {BAD}, seen  # the bad sample was skipped, every other one seen


LIGHTNING = [  # (loader, strategy, where the loader comes from)
    ("stoker", "single", "hook"),
    ("stoker", "ddp", "fit"),  # was: "got multiple values for argument 'sampler'"
    ("enable", "ddp", "hook"),
    ("stoker", "ddp_spawn", "hook"),
    ("enable", "ddp_spawn", "fit"),
]


@needs("lightning")
@pytest.mark.parametrize("kind,strategy,where", LIGHTNING)
def test_lightning(tmp_path, kind, strategy, where):
    rep = str(tmp_path / "report")
    run([os.path.join(SCRIPTS, "lightning_train.py"), kind, strategy, where, rep], tmp_path)
    reps = reports(rep)
    ranks = 1 if strategy == "single" else 2
    check_ranks(reps, ranks, "stoker.DataLoader" if kind == "stoker" else "stoker.enable()")
    for r in reps:
        if ranks == 2:  # Lightning re-created the loader with its DistributedSampler ...
            assert r["sampler"] == "DistributedSampler", r
        if kind == "stoker":  # ... and kept stoker's options
            assert r["loader"] == "DataLoader" and r["on_error"] == "skip", r


@needs("accelerate")
def test_accelerate_prepare_one_process(tmp_path):
    rep = str(tmp_path / "report")
    run([os.path.join(SCRIPTS, "accelerate_prepare.py"), "enable", rep], tmp_path)
    check_ranks(reports(rep), 1, "stoker.enable()")


@needs("accelerate")
def test_accelerate_prepare_two_ranks_under_torchrun_and_stoker_run(tmp_path):
    """An unchanged script: `torchrun ... -m stoker run script.py`, options from the
    environment."""
    rep = str(tmp_path / "report")
    r = run(["-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "stoker", "run",
             os.path.join(SCRIPTS, "accelerate_prepare.py"), "plain", rep], tmp_path,
            env={"STOKER_ON_ERROR": "skip", "OMP_NUM_THREADS": "1"})
    reps = reports(rep)
    check_ranks(reps, 2, "stoker.enable()")
    assert all(x["world"] == 2 for x in reps)
    assert r.stderr.count("is served by stoker's engine") == 2  # one line per rank


@needs("transformers", "accelerate")
def test_transformers_trainer_and_resume(tmp_path):
    rep = tmp_path / "report.json"
    run([os.path.join(SCRIPTS, "trainer_resume.py"), str(tmp_path / "out"), str(rep)], tmp_path)
    r = json.loads(rep.read_text())
    assert [s[0] for s in r["first"]] == [1, 2, 3]
    assert all(s[1] == "stoker.enable()" and s[2] > 0 for s in r["first"]), r
    assert [s[0] for s in r["resumed"]] == [4, 5, 6]  # resumed from checkpoint-3
    # Samples 0..11 are read in the first run, 5 among them (skipped); every one seen by the
    # model, first run and resumed, was loaded by a stoker worker.
    assert r["engine_first"] and set(r["engine_first"]) == {1}, r
    assert r["engine_resumed"] and set(r["engine_resumed"]) == {1}, r


@needs("datasets", "webdataset", "torchdata")
def test_datasets_webdataset_torchdata(tmp_path):
    r = run([os.path.join(SCRIPTS, "data_libs.py"), str(tmp_path)], tmp_path)
    cases = {}
    for line in r.stdout.splitlines():
        if line.startswith("CASE "):
            c = json.loads(line[5:])
            cases[c["case"]] = c
    expected_rows = [[i, 1] for i in range(12)]  # every row once, each from a stoker worker
    for kind, served in (("stoker", "stoker.DataLoader"), ("enable", "stoker.enable()")):
        names = [f"datasets-map-{kind}", f"datasets-stream-{kind}", f"webdataset-{kind}"]
        if kind == "enable":
            names.append("webloader-enable")
        for name in names:
            assert cases[name]["rows"] == expected_rows, cases.get(name)
            assert cases[name]["served_by"] == served, cases[name]
    # torchdata's StatefulDataLoader keeps its own iterator: left alone, named once.
    assert cases["torchdata-enable"] == {"case": "torchdata-enable", "rows": list(range(8)),
                                         "served_by": None}
    assert r.stderr.count("StatefulDataLoader brings its own iterator") == 1, r.stderr
