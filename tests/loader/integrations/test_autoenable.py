"""Carrying ``stoker.enable()`` into child processes (loader/integrations/children.py, the parent side;
loader/integrations/on_torch_import.py, the child side; docs/design/enable.md): a child enables stoker
once it imports torch, never imports torch for it, loads each stoker file once, and starts as it
would have where stoker cannot be found."""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import os
import pickle
import stat
import sys

import pytest

import stoker
from stoker.loader.integrations import children, enable, on_torch_import
from support.scenarios import (
    HERE,  # tests/
    run_ok,
)

CALLS: list = []


def _record(*args):
    CALLS.append(args)


ENTRY = f"{__name__}:{_record.__qualname__}"


@pytest.fixture
def fresh_hook(monkeypatch):
    """No on_torch_import loaded yet, as in a child that just started (the test's own comes
    back afterwards)."""
    monkeypatch.delitem(sys.modules, children.HOOK, raising=False)
    CALLS.clear()
    yield
    CALLS.clear()


def _package_spec(monkeypatch, places):
    """Makes find_spec("stoker") answer a package that spans `places` (an editable install)."""
    real = importlib.util.find_spec

    def find_spec(name, *args):
        if name == "stoker":
            spec = importlib.machinery.ModuleSpec("stoker", None, is_package=True)
            spec.submodule_search_locations = list(places)
            return spec
        return real(name, *args)

    monkeypatch.setattr("importlib.util.find_spec", find_spec)


@pytest.mark.unit
def test_the_carry_finds_the_hook_in_any_of_the_packages_locations(monkeypatch, tmp_path,
                                                                   fresh_hook):
    package = os.path.dirname(stoker.__file__)  # the package, where HOOK_FILE is
    _package_spec(monkeypatch, [str(tmp_path), package])  # the first has no hook file
    pickle.loads(pickle.dumps(children._Carry(ENTRY, '{"on_error": "skip"}')))
    assert CALLS == [('{"on_error": "skip"}',)]  # torch is imported here: called at once
    hook = sys.modules[children.HOOK]
    assert hook.__file__ == os.path.join(package, *children.HOOK_FILE)
    assert hook is not on_torch_import  # loaded by path, as in a child, under the same name


@pytest.mark.unit
def test_the_carry_does_nothing_where_the_package_has_no_hook(monkeypatch, tmp_path,
                                                             fresh_hook):
    _package_spec(monkeypatch, [str(tmp_path)])
    pickle.loads(pickle.dumps(children._Carry(ENTRY, "{}")))
    assert CALLS == [] and children.HOOK not in sys.modules


@pytest.mark.unit
def test_a_call_that_fails_is_named_and_raises_nothing(capsys):
    on_torch_import.call("stoker_is_not_here.enable:enable_in_child", "{}")
    err = capsys.readouterr().err
    assert f"process {os.getpid()}" in err and "ModuleNotFoundError" in err, err
    assert "torch's own workers" in err


@pytest.mark.unit
def test_enable_in_child_refuses_what_is_not_the_options_json():
    with pytest.raises(ValueError, match="not the JSON object of options"):
        enable.enable_in_child("[1, 2]")
    assert not enable.is_enabled()


@pytest.mark.unit
def test_sitecustomize_names_what_children_py_and_enable_py_define():
    path = os.path.join(children.SITE, "sitecustomize.py")
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    named = {t.id: ast.literal_eval(node.value) for node in tree.body
             if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)}
    fn = enable.enable_in_child
    assert named == {"ENV": children.ENV, "HOOK": children.HOOK,
                     "ENTRY": f"{fn.__module__}:{fn.__qualname__}"}
    module, _, name = named["ENTRY"].partition(":")
    assert getattr(sys.modules[module], name) is fn
    assert os.path.isfile(os.path.join(os.path.dirname(children.SITE), children.HOOK_FILE[-1]))


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_children_enable_once_they_import_torch_and_only_then(method):
    run_ok("enable_children.children_of_an_enabled_process", method, timeout=240)


def test_a_child_that_cannot_find_stoker_starts_as_it_would_have(tmp_path):
    python = tmp_path / "python-without-path"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} -E -S \"$@\"\n")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    r = run_ok("enable_children.child_that_cannot_find_stoker", str(python), timeout=240)
    assert "stoker:" not in r.stderr, r.stderr


@pytest.mark.parametrize("look_first", [False, True])
def test_a_process_started_under_stoker_run_enables_once_it_imports_torch(look_first):
    env = {"PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])}
    children.reach_reruns(env, '{"on_error": "skip"}')  # what `stoker run` does to its own
    assert env["PYTHONPATH"].split(os.pathsep)[0] == children.SITE
    run_ok("enable_children.started_under_stoker_run", look_first, env=env, timeout=120)


def test_a_process_started_under_stoker_run_with_bad_options_still_imports_torch():
    env = {"PYTHONPATH": os.pathsep.join([children.SITE, HERE, os.environ.get("PYTHONPATH", "")]),
           children.ENV: "on_error=skip"}
    r = run_ok("selftest.echo", 1, env=env, timeout=60)  # imports scenario_datasets -> torch
    assert "ECHO 1 0" in r.stdout, r.stdout + r.stderr
    assert "STOKER_ENABLE='on_error=skip' is not the JSON object of options" in r.stderr, r.stderr

