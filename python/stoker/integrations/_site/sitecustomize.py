"""Put on PYTHONPATH by ``stoker run``: every Python process it starts (Lightning's DDP ranks,
torchrun's, spawned workers) runs with ``stoker.enable()`` and the same options. Then the
sitecustomize this one shadows, if any, runs as usual."""

import importlib
import importlib.util
import os
import sys


def _enable():
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(os.path.dirname(here), "autoenable.py")
    spec = importlib.util.spec_from_file_location("stoker._autoenable_light", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["stoker._autoenable_light"] = module
    module.from_env()


if os.environ.get("STOKER_ENABLE"):
    _enable()


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
