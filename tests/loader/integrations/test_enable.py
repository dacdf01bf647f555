"""stoker.enable() / stoker run, and stoker.DataLoader as a well-behaved torch subclass (what
frameworks do to loaders: re-create them from attributes, pickle and copy them, wrap __init__)."""

from __future__ import annotations

import copy
import inspect
import os
import pickle
import shutil
import subprocess
import sys

import pytest
from torch.utils.data import DataLoader

import stoker
from scenarios.enable import Squares
from stoker.loader.integrations import enable as _enable
from support.scenarios import (
    HERE,  # tests/
    run_ok,
)


@pytest.fixture(autouse=True)
def _disabled():
    yield
    stoker.disable()


@pytest.mark.unit
def test_dataloader_calls_torch_init_with_keywords(monkeypatch):
    seen = {}
    original = DataLoader.__init__

    def spy(self, *args, **kwargs):  # what Lightning's __init__ wrapper records
        seen["args"], seen["kwargs"] = args, kwargs
        original(self, *args, **kwargs)

    monkeypatch.setattr(DataLoader, "__init__", spy)
    stoker.DataLoader(list(range(8)), batch_size=2, sampler=None, num_workers=0)
    assert seen["args"] == (list(range(8)),)
    assert seen["kwargs"]["batch_size"] == 2 and "sampler" in seen["kwargs"]


def test_dataloader_is_imported_with_the_package():
    r = run_ok("enable_import.dataloader_is_imported_with_the_package", timeout=60)
    assert r.stdout.split() == ["True", "True", "OK"], r.stdout + r.stderr


def _recreate(loader):
    """What Lightning does to add a DistributedSampler: the __init__ parameters whose
    attribute differs from the default, passed back by name."""
    params = inspect.signature(type(loader).__init__).parameters
    attrs = {k: v for k, v in vars(loader).items() if not k.startswith("_")}
    kwargs = {k: v for k, v in attrs.items() if k in params and params[k].default is not v
              and k not in ("sampler", "batch_sampler")}  # Lightning puts in its own
    kwargs["dataset"] = loader.dataset
    return type(loader)(**kwargs)


@pytest.mark.unit
def test_options_are_public_attributes_and_survive_recreation():
    dl = stoker.DataLoader(list(range(8)), batch_size=2, on_error="skip", max_retries=5,
                           hang_timeout=30.0, on_worker_death="raise", max_shared_memory=1 << 30)
    assert (dl.on_error, dl.max_retries, dl.hang_timeout) == ("skip", 5, 30.0)
    again = _recreate(dl)
    for name in ("on_error", "max_retries", "hang_timeout", "on_worker_death",
                 "max_shared_memory"):
        assert getattr(again, name) == getattr(dl, name), name
    assert again.options.max_shared_memory == 1 << 30


def test_loader_pickles_and_copies_after_an_epoch_with_its_own_state():
    dl = stoker.DataLoader(Squares(), batch_size=2, num_workers=2, on_error="skip",
                           persistent_workers=True)
    assert [b.tolist() for b in dl] == [[[0], [1]], [[4]], [[16], [25]], [[36], [49]]]
    it = iter(dl)  # a live iterator with its workers
    next(it)
    assert len(dl.stats()["workers"]) == 2
    skipped = len(dl.skipped)  # epoch 1's, and epoch 2's once its workers reached index 3
    for other in (copy.deepcopy(dl), pickle.loads(pickle.dumps(dl)), copy.copy(dl)):
        assert other.on_error == "skip"
        assert other.stats()["workers"] == []  # not the original's live iterator
        assert [s["index"] for s in other.stats()["skipped"]] == [3] * skipped
        other.skipped.clear()
        assert len(dl.skipped) == skipped  # the copy's records are its own
    assert len(dl.stats()["workers"]) == 2
    del it


def test_enable_serves_torch_loaders_made_before_and_after_of_any_subclass():
    class Mine(DataLoader):  # a framework's subclass, defined before enable()
        pass

    before = Mine(Squares(), batch_size=2, num_workers=2)
    stoker.enable(on_error="skip")
    stoker.enable(on_error="skip")  # idempotent

    class Later(DataLoader):
        pass

    for dl in (before, DataLoader(Squares(), batch_size=2, num_workers=2),
               Later(Squares(), batch_size=4, num_workers=1)):
        it = iter(dl)
        assert type(it).__name__ == "MultiProcessIter", type(dl)
        flat = [v for b in it for v in b.flatten().tolist()]
        assert flat == [0, 1, 4, 16, 25, 36, 49]  # index 3 skipped: the option applies
        st = stoker.stats(dl)
        assert st["served_by"] == "stoker.enable()" and st["skipped"][0]["index"] == 3
        # a torch loader has no .skipped: stoker.skipped(loader) is where its skips are
        assert [s.index for s in stoker.skipped(dl)] == [3] and stoker.deaths(dl) == []
    # num_workers=0 stays torch's (and so does its error)
    assert type(iter(DataLoader(Squares(), num_workers=0))).__name__ == \
        "_SingleProcessDataLoaderIter"
    stoker.disable()
    assert type(iter(before)).__name__ == "_MultiProcessingDataLoaderIter"
    stoker.disable()  # idempotent too


def test_enable_leaves_stoker_dataloader_options_alone():
    stoker.enable(on_error="skip")
    dl = stoker.DataLoader(Squares(), batch_size=2, num_workers=1)  # on_error="raise"
    with pytest.raises(ValueError, match="sample 3 is bad"):
        list(dl)
    assert dl.stats()["served_by"] == "stoker.DataLoader"


@pytest.mark.unit
def test_enable_checks_options():
    with pytest.raises(ValueError, match="on_error must be one of"):
        stoker.enable(on_error="ignore")
    with pytest.raises(TypeError, match="unknown stoker option"):
        stoker.enable(on_eror="skip")
    assert not _enable.is_enabled()


@pytest.mark.unit
def test_enable_is_thread_safe():
    import threading

    originals = (DataLoader._get_iterator, DataLoader.__iter__)
    threads = [threading.Thread(target=stoker.enable, kwargs={"max_retries": i})
               for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    patched = DataLoader._get_iterator
    assert patched is not originals[0]
    stoker.enable()
    assert DataLoader._get_iterator is patched  # patched once, never wrapped twice
    stoker.disable()
    assert (DataLoader._get_iterator, DataLoader.__iter__) == originals


def test_first_iterator_logs_who_serves_the_loader(caplog):
    stoker.enable(on_error="skip")
    dl = DataLoader(Squares(), batch_size=2, num_workers=1)
    with caplog.at_level("INFO", logger="stoker"):
        list(dl)
        list(dl)
    served = [r.message for r in caplog.records if "served by stoker's engine" in r.message]
    assert len(served) == 1, served
    assert "torch.utils.data.dataloader.DataLoader (stoker.enable())" in served[0]
    assert "on_error='skip'" in served[0]


def test_stoker_top_names_the_server():
    r = run_ok("enable.top_names_the_server", timeout=120)
    assert 'SERVER ["stoker.enable() ShardLoader"]' in r.stdout, r.stdout + r.stderr
    assert "stoker.enable() ShardLoader" in r.stdout.split("SERVER")[1].split("\n", 1)[1]


@pytest.mark.parametrize("how", ["script", "module"])
def test_stoker_run_serves_an_unchanged_script_and_its_spawned_children(tmp_path, how):
    shutil.copy(os.path.join(HERE, "scenarios", "train_unchanged.py"), tmp_path)
    env = dict(os.environ, STOKER_ON_ERROR="skip",
               PYTHONPATH=os.pathsep.join([HERE, str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    target = ["train_unchanged.py"] if how == "script" else ["-m", "train_unchanged"]
    r = subprocess.run([sys.executable, "-m", "stoker", "run", "--max-retries", "1", *target,
                        "--lr", "0.1"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=240)
    out = r.stdout
    assert r.returncode == 0, out + r.stderr
    assert "ARGS ['--lr', '0.1']" in out
    assert "MAIN 7 stoker.enable()" in out, out + r.stderr  # index 3 skipped: on_error from env
    assert "CHILD 7 stoker.enable()" in out, out + r.stderr  # a spawned child: same setting
    assert "served by stoker's engine" in r.stderr and "max_retries=1" in r.stderr
    assert "leaked semaphore" not in r.stderr


def test_stoker_run_rejects_bad_options():
    r = subprocess.run([sys.executable, "-m", "stoker", "run", "--on-error", "ignore", "x.py"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "on_error must be one of" in r.stderr


def test_enable_reaches_spawned_children_of_a_program():
    r = run_ok("enable.enable_reaches_spawned_children", timeout=240)
    assert "CHILD (7, 'stoker.enable()')" in r.stdout, r.stdout + r.stderr
    assert "AFTER None" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("persistent", [True, False])
def test_exit_with_a_live_spawn_iterator_leaks_no_semaphore(persistent):
    r = run_ok("enable.exit_with_a_live_spawn_iterator", persistent, timeout=120)
    assert "EXITING" in r.stdout, r.stdout + r.stderr
    assert "leaked semaphore" not in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
