"""Put on PYTHONPATH by ``stoker run``: every Python process it starts (Lightning's DDP ranks,
torchrun's, spawned workers) runs with ``stoker.enable()`` and the same options, from the moment
it imports torch. Then the sitecustomize this one shadows, if any, runs as usual.

It imports nothing of stoker (that would import torch in every process, torch user or not): it
loads ``../on_torch_import.py`` by file path, under that module's own name, and arms it to call
``ENTRY`` with ``$STOKER_ENABLE`` (``children.py`` arms spawn children with the same).

Runs while the interpreter starts, on its one thread.
"""

import importlib
import importlib.util
import os
import sys

# loader/integrations/children.py's ENV and HOOK, and enable.py's enable_in_child (tests hold them equal)
ENV = "STOKER_ENABLE"
HOOK = "stoker.loader.integrations.on_torch_import"
ENTRY = "stoker.loader.integrations.enable:enable_in_child"


def _arm(raw):
    hook = sys.modules.get(HOOK)
    if hook is None:
        here = os.path.dirname(os.path.abspath(__file__))
        spec = importlib.util.spec_from_file_location(
            HOOK, os.path.join(os.path.dirname(here), "on_torch_import.py"))
        hook = importlib.util.module_from_spec(spec)
        sys.modules[HOOK] = hook
        spec.loader.exec_module(hook)
    hook.call(ENTRY, raw)


if os.environ.get(ENV):
    _arm(os.environ[ENV])


def _chain():
    here = os.path.dirname(os.path.abspath(__file__))
    mine = sys.modules.pop("sitecustomize", None)
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        importlib.import_module("sitecustomize")
    except ImportError:
        if mine is not None:
            sys.modules["sitecustomize"] = mine
    finally:
        sys.path[:] = saved


_chain()
