"""common/gil.py: the module whose import turned the GIL on is noted from the interpreter's
warning, and stoker says so once. The interpreter is faked free-threaded here (any Python runs
these); tests/test_free_threading.py runs the real path on a free-threaded one."""

from __future__ import annotations

import warnings

import pytest

from stoker.common import gil
from stoker.common.errors import GILEnabledWarning

pytestmark = pytest.mark.unit

INTERPRETERS = ("The global interpreter lock (GIL) has been enabled to load module 'cv2.cv2', "
                "which has not declared that it can run safely without the GIL. To override "
                "this behavior and keep the GIL disabled (at your own risk), run with "
                "PYTHON_GIL=0 or -Xgil=0.")


@pytest.fixture
def fresh(monkeypatch):
    """A free-threaded interpreter whose GIL is off (`state["on"]` turns it on), gil.py's state
    as at start."""
    state = {"on": False, "flag": None}
    monkeypatch.setattr(gil, "free_threaded", lambda: True)
    monkeypatch.setattr(gil, "enabled", lambda: state["on"])
    monkeypatch.setattr(gil, "chosen_by_user", lambda: state["flag"] == 1)
    for name, value in (("_enabler", None), ("_warned", False), ("_watching", False),
                        ("_off_at_import", False)):
        monkeypatch.setattr(gil, name, value)
    return state


def test_the_module_is_read_from_the_interpreters_warning(fresh):
    assert gil.note("something else") is None and gil.enabler() is None
    assert gil.note(INTERPRETERS) == "cv2.cv2" and gil.enabler() == "cv2.cv2"
    gil.note(INTERPRETERS.replace("cv2.cv2", "later"))  # the first one stays
    assert gil.enabler() == "cv2.cv2"


def test_watch_notes_the_warning_passes_it_on_and_steps_aside(fresh, monkeypatch):
    shown = []
    monkeypatch.setattr(warnings, "showwarning", lambda *a, **k: shown.append(a[0]))
    before = warnings.showwarning
    gil.watch()
    assert warnings.showwarning is not before
    warnings.simplefilter("always")  # (pytest restores the filters after the test)
    warnings.warn("unrelated", RuntimeWarning, stacklevel=1)
    assert gil.enabler() is None
    warnings.warn_explicit(INTERPRETERS, RuntimeWarning, "<frozen importlib._bootstrap>", 1)
    assert warnings.showwarning is before  # seen once: the wrapper is gone
    assert gil.enabler() == "cv2.cv2"
    assert [str(m) for m in shown] == ["unrelated", INTERPRETERS]  # shown as before


def test_watch_does_nothing_where_the_gil_is_on_or_by_build(fresh, monkeypatch):
    before = warnings.showwarning
    fresh["on"] = True
    gil.watch()
    assert warnings.showwarning is before
    fresh["on"] = False
    monkeypatch.setattr(gil, "free_threaded", lambda: False)
    gil.watch()
    assert warnings.showwarning is before


def test_warns_once_naming_the_module(fresh):
    gil.note(INTERPRETERS)
    assert not gil.warn_if_enabled()  # still off
    fresh["on"] = True
    with pytest.warns(GILEnabledWarning, match=r"importing 'cv2\.cv2' turned it back on"):
        assert gil.warn_if_enabled()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not gil.warn_if_enabled()  # once per process


def test_an_unseen_module_sends_the_reader_to_doctor(fresh):
    fresh["on"] = True
    with pytest.warns(GILEnabledWarning, match="stoker doctor") as seen:
        gil.warn_if_enabled()
    assert "PYTHON_GIL=0" in str(seen[0].message)


@pytest.mark.parametrize("case", ["gil by build", "user asked for it"])
def test_no_warning_where_the_gil_is_expected(fresh, monkeypatch, case):
    fresh["on"] = True
    if case == "gil by build":
        monkeypatch.setattr(gil, "free_threaded", lambda: False)
    else:
        fresh["flag"] = 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not gil.warn_if_enabled()


def test_a_worker_warns_only_for_what_it_turned_on_itself(fresh):
    fresh["on"] = True
    gil.imported()  # on already when stoker was imported here: the main process said it
    assert not gil.warn_in_worker()
    fresh["on"] = False
    gil.imported()
    fresh["on"] = True  # the dataset's import in this worker
    with pytest.warns(GILEnabledWarning):
        assert gil.warn_in_worker()


def test_a_child_multiprocessing_is_starting_is_told_apart(monkeypatch):
    """A spawned or forkserver child imports stoker while it unpickles its target: the import
    then says nothing (its parent said it), whereas a script's import does."""
    import multiprocessing.process

    assert not gil.in_worker_start()
    monkeypatch.setattr(multiprocessing.process.current_process(), "_inheriting", True,
                        raising=False)
    assert gil.in_worker_start()
    monkeypatch.delattr(multiprocessing.process.current_process(), "_inheriting")
    monkeypatch.setattr(multiprocessing.process, "parent_process", lambda: object())
    assert gil.in_worker_start()
