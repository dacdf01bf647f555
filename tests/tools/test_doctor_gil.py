"""``stoker doctor``'s GIL check (tools/doctor_gil.py): the installed packages with extension
modules are the candidates, each is imported in a fresh interpreter, and the interpreter's
warning names the module that turned the GIL on. Here a fake package says what the interpreter
says, so any Python runs these; tests/test_free_threading.py has a real extension module turn a
free-threaded interpreter's GIL on."""

from __future__ import annotations

import importlib.machinery
import sys

import pytest

from stoker.common import gil
from stoker.tools import doctor_gil

SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]
WARNING = ("The global interpreter lock (GIL) has been enabled to load module '{}', which has "
           "not declared that it can run safely without the GIL.")


class Dist:
    def __init__(self, *files):
        self.files = files


@pytest.mark.unit
def test_candidates_are_packages_with_extension_modules_for_this_interpreter():
    found = doctor_gil.candidates([
        Dist("numpy/__init__.py", f"numpy/_core/_multiarray_umath{SUFFIX}",
             f"numpy/linalg/_umath_linalg{SUFFIX}", "numpy/core/_internal.py"),
        Dist("pure/__init__.py", "pure/x.py"),
        Dist("nvidia/cublas/lib/libcublas.so.13", "nvidia/cu/lib/libnvrtc-builtins.so"),
        Dist(f"stoker/_stoker{SUFFIX}"),
        Dist(f"_cffi_backend{SUFFIX}", f"not-a-module/x{SUFFIX}"),
    ])
    assert found == {"_cffi_backend": ["_cffi_backend"],
                     "numpy": ["numpy._core._multiarray_umath", "numpy.linalg._umath_linalg"]}


@pytest.mark.unit
def test_a_python_with_a_gil_by_build_is_not_probed(monkeypatch):
    monkeypatch.setattr(gil, "free_threaded", lambda: False)
    monkeypatch.setattr(doctor_gil, "gil_enablers", lambda *a, **k: pytest.fail("probed"))
    c = doctor_gil.check({"numpy": ["numpy._core.x"]})
    assert c["status"] == "ok" and "GIL by build" in c["detail"]


@pytest.mark.unit
def test_the_check_names_each_module_that_turns_the_gil_on(monkeypatch):
    monkeypatch.setattr(gil, "free_threaded", lambda: True)
    monkeypatch.setattr(gil, "chosen_by_user", lambda: False)
    reports = {"cv2": {"named": "cv2.cv2", "error": None},
               "numpy": {"named": None, "error": None},
               "slow": {"named": None, "error": "its imports took longer than 1 s"}}
    monkeypatch.setattr(doctor_gil, "gil_enablers", lambda found, python: reports)
    c = doctor_gil.check({"cv2": [], "numpy": [], "slow": []})
    assert c["status"] == "warn", c
    assert "'cv2.cv2' (package cv2)" in c["detail"] and "numpy" not in c["detail"].split(":")[-1]
    assert "not judged: slow" in c["detail"] and "PYTHON_GIL=0" in c["advice"]
    monkeypatch.setattr(doctor_gil, "gil_enablers", lambda found, python: {"numpy": reports["numpy"]})
    assert doctor_gil.check({"numpy": []})["status"] == "ok"


def test_a_probe_names_the_module_its_interpreter_warned_about(tmp_path, monkeypatch):
    """A fresh interpreter imports the package, then its modules in turn; the first warning
    that names a module is the answer, and a module that cannot be imported alone is listed."""
    pkg = tmp_path / "fakepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "broken.py").write_text("raise ImportError('needs a GPU')\n")
    (pkg / "native.py").write_text(
        f"import warnings\nwarnings.warn({WARNING.format('fakepkg.native')!r}, RuntimeWarning)\n")
    (pkg / "after.py").write_text("raise SystemExit('imported after the answer')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    report = doctor_gil.probe("fakepkg", ["fakepkg.broken", "fakepkg.native", "fakepkg.after"],
                              sys.executable, timeout=60)
    assert report["error"] is None and report["named"] == "fakepkg.native", report
    assert report["failed"] == [["fakepkg.broken", "ImportError: needs a GPU"]]
    clean = doctor_gil.probe("fakepkg", [], sys.executable, timeout=60)
    assert clean["named"] is None and clean["error"] is None


def test_an_interpreter_that_dies_or_hangs_is_reported_not_judged(tmp_path, monkeypatch):
    (tmp_path / "crashes.py").write_text("import os\nos._exit(3)\n")
    (tmp_path / "hangs.py").write_text("import time\ntime.sleep(60)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    assert "without a report" in doctor_gil.probe("crashes", [], sys.executable, 60)["error"]
    assert "longer than" in doctor_gil.probe("hangs", [], sys.executable, 2)["error"]
    # several, within one budget
    got = doctor_gil.gil_enablers({"crashes": [], "hangs": []}, sys.executable, budget_s=3)
    assert set(got) == {"crashes", "hangs"} and all(r["error"] for r in got.values())
