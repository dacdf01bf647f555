"""stoker on a free-threaded Python (3.13t, 3.14t): the GIL stays off after ``import stoker`` and
in every worker, whatever starts them, and a module that turns it back on is named (at the
loader's start, in the worker that imported it, by ``stoker doctor``). Skipped where the
interpreter has a GIL by build; the free-threaded leg (make test-ft) runs them, with
tests/test_bindings_under_threads.py. The module that turns the GIL on is a C extension module
compiled here, one that does not declare Py_mod_gil (tests/common/test_gil.py and
tests/tools/test_doctor_gil.py check the same paths with fakes on any Python)."""

from __future__ import annotations

import shutil
import subprocess
import sysconfig

import pytest

from support.scenarios import run_ok

pytestmark = pytest.mark.skipif(not sysconfig.get_config_var("Py_GIL_DISABLED"),
                                reason="this Python has a GIL by build (not free-threaded)")

# The interpreter decides: a PYTHON_GIL of the caller's shell would decide for it.
ENV = {"PYTHON_GIL": ""}

GILMOD = r"""
#include <Python.h>
/* No Py_mod_gil slot: importing it turns a free-threaded interpreter's GIL on. */
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "gilmod", NULL, -1, NULL};
PyMODINIT_FUNC PyInit_gilmod(void) { return PyModule_Create(&def); }
"""


@pytest.fixture(scope="module")
def gilmod(tmp_path_factory) -> str:
    """A folder holding the compiled module `gilmod`."""
    cc = shutil.which(sysconfig.get_config_var("CC").split()[0] if sysconfig.get_config_var("CC")
                      else "cc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler to build the test's extension module with")
    folder = tmp_path_factory.mktemp("gilmod")
    source = folder / "gilmod.c"
    source.write_text(GILMOD)
    target = folder / ("gilmod" + sysconfig.get_config_var("EXT_SUFFIX"))
    subprocess.run([cc, "-shared", "-fPIC", "-I", sysconfig.get_paths()["include"], str(source),
                    "-o", str(target)], check=True, timeout=120)
    return str(folder)


def test_the_gil_stays_off_after_import_and_in_workers():
    run_ok("free_threading.gil_stays_off", ["fork", "forkserver", "spawn"], timeout=240, env=ENV)


def test_a_module_turning_the_gil_on_after_import_is_named_once(gilmod):
    r = run_ok("free_threading.named_when_turned_on_after_import", gilmod, timeout=120,
               env=ENV)
    assert "has been enabled to load module 'gilmod'" in r.stderr  # (the interpreter's, shown)


def test_a_module_turning_it_on_before_import_is_found_by_doctor(gilmod):
    run_ok("free_threading.named_by_doctor_when_turned_on_before", gilmod, timeout=300, env=ENV)


def test_a_module_turning_it_on_in_a_worker_is_named_there(gilmod):
    r = run_ok("free_threading.named_in_the_worker_that_turned_it_on", gilmod, timeout=120,
               env=ENV)
    said = [line for line in r.stderr.splitlines() if "GILEnabledWarning" in line]
    assert len(said) == 2 and all("importing 'gilmod' turned it back on" in x for x in said), \
        r.stderr
