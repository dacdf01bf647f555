"""Children of an enabled process (docs/design/enable.md): what a spawn or forkserver child, or a
process started under ``stoker run``, has loaded and imported, before torch and after.

Imports only the standard library at its top: a spawn child unpickles its target from here, and
what the child has imported is what these scenarios look at.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys

HOOK = "stoker.loader.integrations.on_torch_import"


def _seen(use_torch: bool) -> dict:
    """What this process has: torch and stoker imported or not, the hook armed (loaded, and its
    finder waiting for torch), and once it imports torch (if `use_torch`): stoker enabled, and
    the stoker files loaded more than once (as two module objects)."""
    out = {"torch": "torch" in sys.modules, "stoker": "stoker" in sys.modules,
           "hook": HOOK in sys.modules,
           "waiting": any(type(f).__name__ == "_TorchFinder" for f in sys.meta_path)}
    if use_torch:
        import torch  # noqa: F401  (the import the hook waits for)

        enable = sys.modules.get("stoker.loader.integrations.enable")
        out["enabled"] = enable is not None and enable.is_enabled()
        out["hook_file"] = getattr(sys.modules.get(HOOK), "__file__", None)
        # stoker's files are those of its package: not a path fragment, which a checkout
        # in a folder named "stoker" puts in torch's own paths too
        # (a child that cannot find stoker has none: then no module is stoker's)
        top = getattr(sys.modules.get("stoker"), "__file__", None)
        package = os.path.dirname(os.path.realpath(top)) + os.sep if top else None
        modules: dict[str, set] = {}
        for name, m in list(sys.modules.items()):
            f = getattr(m, "__file__", None) or ""
            real = os.path.realpath(f) if f else ""
            if name == "stoker" or name.startswith("stoker.") or (package and real.startswith(package)):
                modules.setdefault(real, set()).add(id(m))
        out["twice"] = sorted(f for f, ids in modules.items() if len(ids) > 1)
    return out


def _report(q, use_torch):
    q.put(_seen(use_torch))


def _ask(ctx, use_torch: bool) -> dict:
    q = ctx.Queue()
    p = ctx.Process(target=_report, args=(q, use_torch))
    p.start()
    out = q.get(timeout=120)
    p.join(60)
    assert p.exitcode == 0, p.exitcode
    return out


def children_of_an_enabled_process(method):
    """An enabled parent starts two children by `method` (spawn or forkserver): one that never
    imports torch, one that does."""
    import stoker

    stoker.enable(on_error="skip")
    ctx = mp.get_context(method)
    plain = _ask(ctx, use_torch=False)
    print("PLAIN", plain)
    assert plain == {"torch": False, "stoker": False, "hook": True, "waiting": True}, plain
    user = _ask(ctx, use_torch=True)
    print("TORCH", user)
    here = os.path.join(os.path.dirname(stoker.__file__), "loader", "integrations",
                        "on_torch_import.py")
    assert user["enabled"] and user["hook_file"] == here and user["twice"] == [], user


def child_that_cannot_find_stoker(executable):
    """An enabled parent starts a spawn child through `executable` (a Python that starts
    without PYTHONPATH and site-packages, so stoker is nowhere while it unpickles what the
    parent sent): it starts, imports torch and runs as it would have."""
    import stoker

    stoker.enable(on_error="skip")
    ctx = mp.get_context("spawn")
    ctx.set_executable(executable)
    seen = _ask(ctx, use_torch=True)
    print("SEEN", seen)
    assert not seen["hook"] and not seen["enabled"] and seen["twice"] == [], seen


def started_under_stoker_run(look_first=False):
    """A process started with ``STOKER_ENABLE`` and ``_site`` on its PYTHONPATH (what ``stoker
    run`` sets), until and after it imports torch; with `look_first`, it asks whether torch is
    installed before importing it (as transformers' ``is_torch_available`` does)."""
    if look_first:
        import importlib.util

        assert importlib.util.find_spec("torch") is not None
    before = _seen(use_torch=False)
    print("BEFORE", before)
    assert before == {"torch": False, "stoker": False, "hook": True, "waiting": True}, before
    after = _seen(use_torch=True)
    print("AFTER", after)
    assert after["enabled"] and after["twice"] == [], after
