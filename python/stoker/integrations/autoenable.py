"""Carries ``stoker.enable()`` into child processes, without importing torch before they do.

- spawn and forkserver children of an enabled process: the preparation data that multiprocessing
  pickles for a new interpreter carries an object whose unpickling enables stoker in the child
  (``hook_spawn``); if stoker cannot be imported there, the child starts as it would have.
- any process started with ``STOKER_ENABLE`` in its environment and ``stoker/_site`` on its
  PYTHONPATH (what ``stoker run`` sets: Lightning's DDP re-runs the script, torchrun starts ranks):
  its ``sitecustomize`` calls ``from_env``.

Either way, enabling waits until the child imports torch (an import hook on ``torch``), so a child
that never uses torch never pays for importing it. That is also why this module is loaded by file
(``LOAD``), not through ``import stoker``, whose ``__init__`` imports torch: it imports nothing of
stoker at its top (the import-layering test allows it this one way back up, to ``enable``, inside
``_enable_now``, which runs once torch is there).

Thread contract: runs while an interpreter starts (or unpickles its preparation data).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

ENV = "STOKER_ENABLE"

# Loads this file as the module "stoker._autoenable_light" without importing the stoker package.
LOAD = """
import importlib.util as _u, os as _os, sys as _sys
_m = _sys.modules.get("stoker._autoenable_light")
if _m is None:
    _s = _u.find_spec("stoker")
    if _s is not None and _s.submodule_search_locations:
        _p = _os.path.join(list(_s.submodule_search_locations)[0], "integrations",
                           "autoenable.py")
        _spec = _u.spec_from_file_location("stoker._autoenable_light", _p)
        _m = _u.module_from_spec(_spec)
        _spec.loader.exec_module(_m)
        _sys.modules["stoker._autoenable_light"] = _m
"""


def from_env() -> None:
    """Enables stoker (when torch is imported) with the options in ``$STOKER_ENABLE``."""
    raw = os.environ.get(ENV)
    if not raw:
        return
    try:
        options = json.loads(raw)
    except ValueError:
        print(f"stoker: ignoring {ENV}={raw!r}: not the JSON object of options that "
              "`stoker run` writes", file=sys.stderr)
        return
    _when_torch_is_imported(options)


def from_options(raw: str) -> None:
    """Called while a spawned child unpickles its preparation data."""
    os.environ[ENV] = raw
    from_env()


def _enable_now(options: dict) -> None:
    import stoker.integrations.enable as _enable

    if not _enable.is_enabled():
        _enable.enable(**options)


class _TorchHook:
    """A meta-path finder that only watches for ``torch`` and enables stoker once it is
    imported."""

    def __init__(self, options: dict):
        self.options = options

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module
        options = self.options

        def exec_then_enable(module):
            exec_module(module)
            _enable_now(options)

        spec.loader.exec_module = exec_then_enable
        return spec


def _when_torch_is_imported(options: dict) -> None:
    if "torch" in sys.modules:
        _enable_now(options)
        return
    if not any(isinstance(f, _TorchHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchHook(options))


class _Carry:
    """In spawn's preparation data: unpickles as a call that enables stoker in the child."""

    def __init__(self, raw: str):
        self.raw = raw

    def __reduce__(self):
        code = LOAD + f"if _m is not None:\n    _m.from_options({self.raw!r})\n"
        return (exec, (code, {}))


def hook_spawn(originals: dict) -> None:
    """Makes spawn/forkserver children of this process enabled while it is (records the
    original in `originals`, which ``disable()`` restores)."""
    import multiprocessing.spawn as spawn

    original = spawn.get_preparation_data

    def get_preparation_data(name):
        data = original(name)
        raw = os.environ.get(ENV)
        if raw:
            data["stoker_enable"] = _Carry(raw)
        return data

    originals[(spawn, "get_preparation_data")] = original
    spawn.get_preparation_data = get_preparation_data
