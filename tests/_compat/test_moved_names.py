"""stoker 0.2's module paths still import (python/stoker/_compat/moved.py): what a saved pickle
or a user's import names leads to the module where the code is now, the same object."""

from __future__ import annotations

import importlib
import pickle
import runpy
import sys

import pytest

import stoker
from stoker._compat.moved import MOVED

pytestmark = pytest.mark.unit  # no process (tests/support/tiers.py)


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_imports_the_module_now_at_its_new_path(old):
    if old.startswith(("tools.monitoring", "monitoring")):
        pytest.importorskip("prometheus_client")
    new_module = importlib.import_module("stoker." + MOVED[old])
    old_module = importlib.import_module("stoker." + old)
    assert old_module is new_module
    assert old_module.__spec__.name == "stoker." + MOVED[old]  # pickles written now name it
    assert sys.modules["stoker." + old] is new_module


def test_the_table_names_only_modules_that_exist_and_no_module_twice():
    for new in MOVED.values():
        assert importlib.util.find_spec("stoker." + new) is not None, new
    for old in MOVED:
        assert old not in MOVED.values(), f"{old} is both an old and a new name"


def test_a_class_pickled_under_an_old_path_unpickles_as_todays_class():
    from stoker.common.deaths import Death
    from stoker.datasets.shared_list import SharedList

    find = pickle.Unpickler(__import__("io").BytesIO()).find_class
    assert find("stoker._shared_list", "SharedList") is SharedList
    assert find("stoker.engine.deaths", "Death") is Death
    assert find("stoker._errors", "WorkerCrashed") is stoker.WorkerCrashed


def test_the_gone_engine_package_still_leads_to_its_modules():
    from stoker.engine import protocol
    from stoker.engine.worker import WorkerConfig

    from stoker.wire import protocol as now
    from stoker.worker.loop import WorkerConfig as config_now

    assert protocol is now and WorkerConfig is config_now


def test_a_name_that_never_existed_is_still_an_import_error():
    with pytest.raises(ImportError):
        importlib.import_module("stoker.engine.nothing_here")
    with pytest.raises(ImportError):
        importlib.import_module("stoker._nothing_here")


@pytest.mark.filterwarnings("ignore:.stoker.tools.doctor. found in sys.modules")  # (in-process)
def test_an_old_path_runs_as_python_m_runs_it(monkeypatch, capsys):
    """``python -m stoker.doctor`` (0.2's path of a module with a ``__main__`` block) runs the
    module at its new path, whose relative imports resolve there."""
    monkeypatch.setattr(sys, "argv", ["stoker.doctor", "--help"])
    # as in a fresh interpreter, where nothing imported the old name yet
    monkeypatch.delitem(sys.modules, "stoker.doctor", raising=False)
    with pytest.raises(SystemExit) as e:
        runpy.run_module("stoker.doctor", run_name="__main__")
    assert e.value.code == 0
    assert "usage: stoker doctor" in capsys.readouterr().out
