"""Calls a function once this process imports torch: the child side of carrying ``enable()``.

A child of an enabled process (a spawn or forkserver child, a process ``stoker run`` started)
should enable stoker as soon as it could build a loader, and not before: importing ``stoker``
imports torch, and a child that never uses torch should not pay for it. So this module imports
nothing of stoker, not even what it calls: whoever arms it names the function, as
``"module:qualname"``: ``children.py``'s carry into spawn children names the function that
``enable()`` hands it (``enable.enable_in_child``), and ``_site/sitecustomize.py`` names the same.
The function is imported and called right after torch's own module code runs (at once, if torch
is imported already).

It is loaded by file path, before the stoker package, under its own name
(``stoker.loader.integrations.on_torch_import``) and entered in ``sys.modules`` there, so that a later
import by that name finds the same module: no process loads this file twice.

A call that fails (stoker cannot be imported in this process after all, the options are refused)
is named on stderr, and ``import torch`` still succeeds: the process goes on as it would have
without its parent's setting.

Thread contract: ``call`` runs while an interpreter starts (its sitecustomize, or unpickling
spawn's preparation data), on its one thread; the calls it arms run in the thread that imports
torch, under the import lock.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

_pending: list[tuple[str, tuple]] = []  # (entry, args) to call once torch is imported


def call(entry: str, *args) -> None:
    """Calls the function `entry` names (``"module:qualname"``) with `args` once torch is
    imported; now, if it is. The same call armed twice (by sitecustomize and by spawn's carry)
    runs once."""
    if "torch" in sys.modules:
        _run(entry, args)
        return
    if (entry, args) not in _pending:
        _pending.append((entry, args))
    if not any(isinstance(f, _TorchFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchFinder())


def _run(entry: str, args: tuple) -> None:
    module, _, qualname = entry.partition(":")
    try:
        target = importlib.import_module(module)
        for part in qualname.split("."):
            target = getattr(target, part)
        target(*args)
    except Exception as e:
        print(f"stoker: process {os.getpid()} was started by a process with stoker.enable() on, "
              f"but cannot enable it: {entry} failed with {type(e).__name__}: {e}. Its "
              "DataLoaders use torch's own workers.", file=sys.stderr)


class _TorchFinder:
    """On ``sys.meta_path`` until torch's module code has run: each spec it finds for torch has
    a loader that runs the pending calls right after that code. A look that does not import
    (``importlib.util.find_spec("torch")``, as transformers' ``is_torch_available`` does) leaves
    it in place for the import that follows."""

    def __init__(self):
        self._finding = False  # this finder asking the others (its own question comes back)

    def find_spec(self, name, path=None, target=None):
        if name != "torch" or self._finding:
            return None
        self._finding = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._finding = False
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_call(module):
            exec_module(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            while _pending:
                _run(*_pending.pop(0))

        spec.loader.exec_module = exec_then_call
        return spec
