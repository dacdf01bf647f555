"""Module paths before the floor plan (stoker 0.2) still import: a saved pickle, a user's import.

stoker 0.2 kept thirteen private modules at the package root and an ``engine`` package that mixed
what runs in a worker with what runs in the training process; 0.3 put each module under the folder
that says which process it runs in (docs/design/README.md). A loader 0.2 pickled names classes
by their old modules (``stoker._loader.DataLoader``, ``stoker.config.records``'s records holding
``stoker.engine.deaths.Death``), and users wrote ``import stoker.monitoring``. ``MOVED`` says where
each went; ``Finder``, first on ``sys.meta_path`` once ``import stoker`` ran, makes an old name
import the new module itself (the same object, so classes compare equal and pickles written now
name the new path). ``engine``, a package that is gone, imports as an empty package whose
submodules are found the same way. docs/design/python.md has the table.

Thread contract: ``install`` runs while ``stoker`` is imported (under the import lock); the finder
runs under the import system's locks, from any thread.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types

# old module (below stoker) -> the module it is now
MOVED = {
    "_advice": "common.advice",
    "_by_value": "pickling.by_value",
    "_errors": "common.errors",
    "_indices": "common.indices",
    "_info": "datasets.worker_info",
    "_loader": "loader.dataloader",
    "_main_script": "pickling.main_script",
    "_per_worker": "datasets.per_worker",
    "_pickling": "pickling.pickler",
    "_plain": "common.plain",
    "_shared_list": "datasets.shared_list",
    "_system": "common.system",
    "_torch_compat": "common.torch_compat",
    "autotune": "loader.autotune",
    "autotune.controller": "loader.autotune.controller",
    "autotune.measure": "loader.autotune.measure",
    "autotune.memory": "loader.autotune.memory",
    "autotune.tuner": "loader.autotune.tuner",
    "bench": "tools.bench",
    "bench.autotune": "tools.bench.autotune",
    "bench.bound": "tools.bench.bound",
    "bench.cli": "tools.bench.cli",
    "bench.harness": "tools.bench.harness",
    "bench.main_cost": "tools.bench.main_cost",
    "bench.object_server": "tools.bench.object_server",
    "bench.peers": "tools.bench.peers",
    "bench.ranks": "tools.bench.ranks",
    "bench.remote": "tools.bench.remote",
    "bench.workloads": "tools.bench.workloads",
    "doctor": "tools.doctor",
    "engine.board": "wire.board",
    "engine.buffer_batch": "wire.buffer_batch",
    "engine.collate": "worker.collate",
    "engine.deaths": "common.deaths",
    "engine.endpoint": "worker.endpoint",
    "engine.events": "wire.events",
    "engine.fdpass": "wire.fdpass",
    "engine.fetch": "worker.fetch",
    "engine.gate": "worker.gate",
    "engine.inflight": "worker.inflight",
    "engine.process": "worker.process",
    "engine.protocol": "wire.protocol",
    "engine.rng_state": "common.rng_state",
    "engine.sealed": "wire.sealed",
    "engine.stream_state": "wire.stream_state",
    "engine.worker": "worker.loop",
    "gpu": "loader.gpu",
    "gpu.cuda": "loader.gpu.cuda",
    "gpu.device": "loader.gpu.device",
    "gpu.last_mile": "loader.gpu.last_mile",
    "gpu.pinning": "loader.gpu.pinning",
    "gpu.runtime": "loader.gpu.runtime",
    "gpu.tree": "loader.gpu.tree",
    "integrations": "loader.integrations",
    "integrations._site.sitecustomize": "loader.integrations._site.sitecustomize",
    "integrations.children": "loader.integrations.children",
    "integrations.enable": "loader.integrations.enable",
    "integrations.on_torch_import": "loader.integrations.on_torch_import",
    "integrations.run": "tools.run",
    "iterators": "loader.iterators",
    "iterators.exit": "loader.iterators.exit",
    "iterators.failure": "loader.iterators.failure",
    "iterators.handout": "loader.iterators.handout",
    "iterators.multi": "loader.iterators.multi",
    "iterators.recovery": "loader.iterators.recovery",
    "iterators.serve": "loader.iterators.serve",
    "iterators.single": "loader.iterators.single",
    "iterators.starting": "loader.iterators.starting",
    "iterators.stats": "loader.iterators.stats",
    "iterators.supervision": "loader.iterators.supervision",
    "iterators.tasks": "loader.iterators.tasks",
    "iterators.watch": "loader.iterators.watch",
    "monitoring": "tools.monitoring",
    "resume": "loader.resume",
    "resume.checkpoint": "loader.resume.checkpoint",
    "resume.cursor": "loader.resume.cursor",
    "resume.elastic": "loader.resume.elastic",
    "resume.order": "loader.resume.order",
    "resume.position": "loader.resume.position",
    "resume.state": "loader.resume.state",
    "resume.validate": "loader.resume.validate",
    "top": "tools.top",
}
# old packages with no one new package in their place
GONE_PACKAGES = ("engine",)


class _Alias(importlib.abc.Loader):
    """Loads an old name as the module now at ``target`` (imported under its own name first)."""

    def __init__(self, target: str | None) -> None:
        self.target = target
        self.spec = None

    def create_module(self, spec):
        if self.target is None:
            mod = types.ModuleType(spec.name, f"stoker 0.2's {spec.name}: its modules moved "
                                   "(stoker._compat.moved.MOVED)")
            mod.__path__ = []
            return mod
        mod = importlib.import_module(self.target)
        self.spec = mod.__spec__
        return mod

    def exec_module(self, module) -> None:
        if self.spec is not None:  # the import system set the alias's spec on the module
            module.__spec__ = self.spec

    # runpy's (``python -m stoker.doctor``: an old path of a module with a ``__main__`` block).
    # runpy runs the code it gets in a namespace whose package is the old name's parent, where
    # the module's relative imports would not resolve: the code it gets runs the module at its
    # new path instead, under the name runpy chose (``__main__``).
    def _shim(self) -> str:
        return ("import runpy as _runpy\n"
                f"_runpy.run_module({self.target!r}, run_name=__name__, "
                "alter_sys=__name__ == '__main__')\n")

    def get_code(self, fullname):
        if self.target is None:
            return None
        return compile(self._shim(), f"<stoker: {fullname} is {self.target}>", "exec")

    def get_source(self, fullname):
        return None if self.target is None else self._shim()

    def is_package(self, fullname) -> bool:
        return self.target is None


class Finder(importlib.abc.MetaPathFinder):
    """Finds ``stoker.<old>`` for every old name in ``MOVED`` (and ``GONE_PACKAGES``)."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith("stoker."):
            return None
        old = fullname[len("stoker."):]
        if old in MOVED:
            loader = _Alias("stoker." + MOVED[old])
        elif old in GONE_PACKAGES:
            loader = _Alias(None)
        else:
            return None
        package = old in GONE_PACKAGES or any(k.startswith(old + ".") for k in MOVED)
        return importlib.machinery.ModuleSpec(fullname, loader, is_package=package)


def install() -> None:
    """Puts ``Finder`` first on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, Finder())
