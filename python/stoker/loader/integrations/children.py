"""What an enabled process leaves for its children, so that they enable stoker too.

- ``ENV`` (``STOKER_ENABLE``): the options as JSON, in the environment while the process is
  enabled (``enable()`` sets it, ``disable()`` removes it); every child inherits it.
- spawn and forkserver children (Lightning's ``ddp_spawn``, ``mp.spawn``, spawned workers):
  ``hook_spawn`` adds an object to the preparation data that multiprocessing pickles for the
  new interpreter. Unpickling it there loads ``on_torch_import.py`` by file path and arms it to
  call the function ``enable()`` handed to ``hook_spawn``, with the options, once the child
  imports torch.
- processes that re-run a script (``stoker run``: Lightning's DDP ranks, torchrun's):
  ``reach_reruns`` puts the options and ``_site`` (whose ``sitecustomize`` arms the same at
  start-up) in the environment they inherit.

The parent side only. It imports nothing of stoker: ``enable`` imports it and passes down the
function children call, which the carry names as pickle names a function (module and
qualified name), so no module here refers to one above it. The child side, ``on_torch_import``,
imports nothing of stoker either.

Thread contract: ``hook_spawn`` and ``reach_reruns`` run under ``enable()``'s lock or on the
main thread of ``stoker run``; the patched ``get_preparation_data`` runs in whichever thread
starts a process, and only reads.
"""

from __future__ import annotations

import os

ENV = "STOKER_ENABLE"
SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_site")
# The child side: the name it is loaded under, and its file in the package.
HOOK = "stoker.loader.integrations.on_torch_import"
HOOK_FILE = ("loader", "integrations", "on_torch_import.py")

# What unpickling the carry runs in a spawn child. It is source, not a function of stoker,
# because importing stoker there would import torch. It finds on_torch_import.py without
# importing the package, in the first of the package's locations that has it (an editable
# install can have several), loads it under its own name (once: it may be there already), and
# arms it. If stoker is not to be found in the child, or anything else fails, the child starts
# as it would have.
_ARM = """
import importlib.util, os, sys

def _arm(name, parts, entry, raw):
    hook = sys.modules.get(name)
    if hook is None:
        spec = importlib.util.find_spec("stoker")
        places = (spec.submodule_search_locations or ()) if spec is not None else ()
        for path in [os.path.join(place, *parts) for place in places]:
            if os.path.isfile(path):
                found = importlib.util.spec_from_file_location(name, path)
                hook = importlib.util.module_from_spec(found)
                sys.modules[name] = hook
                try:
                    found.loader.exec_module(hook)
                except BaseException:
                    del sys.modules[name]
                    raise
                break
    if hook is not None:
        hook.call(entry, raw)

try:
    _arm(*%r)
except Exception:
    pass
"""


class _Carry:
    """In spawn's preparation data: unpickles, in the child, as running ``_ARM``."""

    def __init__(self, entry: str, raw: str):
        self.entry = entry
        self.raw = raw

    def __reduce__(self):
        return (exec, (_ARM % ((HOOK, HOOK_FILE, self.entry, self.raw),), {}))


def hook_spawn(originals: dict, then) -> None:
    """Makes each spawn/forkserver child started while ``$STOKER_ENABLE`` is set call `then`
    (a module-level function, given that JSON) once it imports torch. Records the original
    ``get_preparation_data`` in `originals` (``disable()`` puts it back)."""
    import multiprocessing.spawn as spawn

    entry = f"{then.__module__}:{then.__qualname__}"
    original = spawn.get_preparation_data

    def get_preparation_data(name):
        data = original(name)
        raw = os.environ.get(ENV)
        if raw:
            data["stoker_enable"] = _Carry(entry, raw)
        return data

    originals[(spawn, "get_preparation_data")] = original
    spawn.get_preparation_data = get_preparation_data


def reach_reruns(environ, raw: str) -> None:
    """Sets `environ` (``os.environ``, for ``stoker run``) so that every Python process started
    from it enables stoker with the options `raw` (JSON): ``ENV``, and ``SITE`` first on
    ``PYTHONPATH``."""
    environ[ENV] = raw
    rest = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    environ["PYTHONPATH"] = os.pathsep.join([SITE] + rest)
