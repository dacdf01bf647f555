"""The tests mirror the package: a test file sits in the folder named for the package it tests
(tests/worker/ for stoker/worker/, tests/placements/node/ for stoker/placements/node/, ...), the
package as a whole at tests/ itself; helpers in tests/support/ (tests/README.md)."""

from __future__ import annotations

import os

import pytest

import stoker
from support.scenarios import HERE  # tests/

pytestmark = pytest.mark.unit  # no process (tests/support/tiers.py)

PACKAGE = os.path.dirname(stoker.__file__)
# the tests of the vision venv (make test-vision) and the Ray cluster's, started inside a network
# namespace by placements/ray/test_ray.py, are whole folders of their own
OWN_FOLDERS = ("vision", os.path.join("placements", "ray", "cluster"))


def _test_files():
    out = []
    for d, dirs, files in os.walk(HERE):
        dirs[:] = [x for x in dirs if x not in ("__pycache__", "data")]
        out += [os.path.join(d, f) for f in files if f.startswith("test_") and f.endswith(".py")]
    return out


def test_every_test_file_sits_in_the_folder_of_the_package_it_tests():
    astray = []
    for path in _test_files():
        folder = os.path.relpath(os.path.dirname(path), HERE)
        if folder == "." or folder in OWN_FOLDERS:
            continue
        if not os.path.isfile(os.path.join(PACKAGE, folder, "__init__.py")):
            astray.append(os.path.relpath(path, HERE))
    assert not astray, f"test files in no package's folder (tests/<package>/...): {astray}"


def test_no_two_test_files_share_a_name():
    """pytest imports a test file by its name (no __init__.py in the folders)."""
    seen: dict[str, str] = {}
    twice = []
    for path in _test_files():
        name = os.path.basename(path)
        if name in seen:
            twice.append((seen[name], os.path.relpath(path, HERE)))
        seen[name] = os.path.relpath(path, HERE)
    assert not twice, twice


def test_the_free_threaded_legs_list_names_test_files_that_exist():
    """FREE_THREADING (tests/support/tiers.py; make test-ft runs it) names test files or folders
    by path: one renamed or moved would drop out of the leg without a word."""
    from support.tiers import FREE_THREADING, SYSTEM

    missing = [m for m in FREE_THREADING
               if not (os.path.isdir(os.path.join(HERE, m)) if m.endswith("/") else
                       os.path.isfile(os.path.join(HERE, m)) and
                       os.path.basename(m).startswith("test_"))]
    assert not missing, f"FREE_THREADING names no test file here: {missing}"
    system = [m for m in FREE_THREADING if any(m.startswith(s) for s in SYSTEM)]
    assert not system, f"the system tier is left out of the leg, so these never run: {system}"
