"""The Python package's imports run one way (docs/design/python.md).

Every import of a stoker module by another, at any depth (imports inside functions count), is an
edge. The test fails on an edge that goes up the layers, on a cycle, on a module no layer claims,
and on a module reaching into another module's private names. Static (ast): no module is run.
"""

from __future__ import annotations

import ast
import os

import pytest

import stoker

pytestmark = pytest.mark.unit  # no process (tests/support/tiers.py)

PACKAGE = os.path.dirname(stoker.__file__)

# Bottom to top. A module may import its own layer and those below it. The folders say which
# process a module runs in (docs/design/README.md); the layers order them.
LAYERS = [
    # any process: facts, errors, pickling; and the dataset helpers users import (in workers)
    ("leaves", ["stoker._stoker", "stoker.common", "stoker.pickling", "stoker.datasets"]),
    # made in the training process, carried whole to every worker
    ("config", ["stoker.config"]),
    # both ends of a worker's channel
    ("wire", ["stoker.wire"]),
    # in a worker process
    ("worker", ["stoker.worker"]),
    # what earlier releases' pickles and imports name
    ("compat", ["stoker._compat"]),
    # where workers run: local processes, the node pool's processes, Ray actors
    ("placements", ["stoker.placements"]),
    # the training process, bottom up
    ("resume", ["stoker.loader.resume"]),
    ("autotune", ["stoker.loader.autotune"]),
    ("gpu", ["stoker.loader.gpu"]),
    ("iterators", ["stoker.loader.iterators"]),
    ("loader", ["stoker.loader"]),
    ("integrations", ["stoker.loader.integrations"]),
    # what a person runs, and the public API
    ("tools", ["stoker", "stoker.__main__", "stoker.tools"]),
]

EXTENSIONS = {"stoker._stoker"}


def _modules() -> dict[str, str]:
    out = {}
    root = os.path.dirname(PACKAGE)
    for d, _, files in os.walk(PACKAGE):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(d, f)
                name = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                out[name[: -len(".__init__")] if name.endswith(".__init__") else name] = path
    return out


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].endswith("__init__.py")


def _resolve(module: str, node) -> list[tuple[str, list[str]]]:
    """(imported stoker module, names taken from it) for one import statement."""
    out = []
    if isinstance(node, ast.Import):
        for a in node.names:
            if a.name == "stoker" or a.name.startswith("stoker."):
                out.append((a.name, []))
        return out
    parts = module.split(".") if _is_package(module) else module.split(".")[:-1]
    if node.level:
        parts = parts[: len(parts) - (node.level - 1)]
        target = ".".join(parts + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if not (target == "stoker" or target.startswith("stoker.")):
        return out
    for a in node.names:
        sub = f"{target}.{a.name}"
        if sub in MODULES or sub in EXTENSIONS:
            out.append((sub, []))
        else:
            out.append((target, [a.name]))
    return out


def _graph():
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    private: list[str] = []
    for m, path in MODULES.items():
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        aliases = {}  # local name -> stoker module it names
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target, names in _resolve(m, node):
                    if target in EXTENSIONS:
                        continue
                    assert target in MODULES, f"{m} imports {target}, which does not exist"
                    if target != m:
                        edges[m].add(target)
                    for n in names:
                        if n.startswith("_") and not n.startswith("__"):
                            private.append(f"{m} imports {n} from {target}")
                if isinstance(node, ast.ImportFrom):
                    for a, (target, names) in zip(node.names, _resolve(m, node)):
                        if not names:
                            aliases[a.asname or a.name] = target
                else:
                    for a in node.names:
                        if a.asname and (a.name == "stoker" or a.name.startswith("stoker.")):
                            aliases[a.asname] = a.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                target = aliases[node.value.id]
                if f"{target}.{node.attr}" not in MODULES | dict.fromkeys(EXTENSIONS):
                    private.append(f"{m} reads {target}.{node.attr}")
    return edges, private


def _layer_of(module: str) -> int | None:
    """The layer of `module`: an entry names a module, or a subpackage and all below it (the
    package itself, "stoker", names only its __init__)."""
    best, best_len = None, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            below = p != "stoker" and module.startswith(p + ".")
            if (module == p or below) and len(p) > best_len:
                best, best_len = i, len(p)
    return best


def test_every_module_has_a_layer():
    missing = sorted(m for m in MODULES if _layer_of(m) is None)
    assert not missing, f"modules no layer claims (add them to LAYERS): {missing}"


def test_no_module_imports_a_layer_above_its_own():
    edges, _ = _graph()
    up = []
    for src, targets in edges.items():
        for dst in targets:
            ls, ld = _layer_of(src), _layer_of(dst)
            if ld is not None and ls is not None and ld > ls:
                up.append(f"{src} ({LAYERS[ls][0]}) imports {dst} ({LAYERS[ld][0]})")
    assert not up, "imports that go up the layers:\n  " + "\n  ".join(sorted(up))


def _cycles(edges) -> list[list[str]]:
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in edges:
        if v not in index:
            visit(v)
    return out


def test_there_is_no_import_cycle_at_any_depth():
    edges, _ = _graph()
    cycles = _cycles(edges)
    described = []
    for comp in cycles:
        inside = sorted(f"{a} -> {b}" for a in comp for b in edges[a] if b in comp)
        described.append(", ".join(inside))
    assert not cycles, "import cycles:\n  " + "\n  ".join(described)


def test_no_module_reaches_into_another_modules_private_names():
    _, private = _graph()
    assert not private, "private names used across modules:\n  " + "\n  ".join(sorted(private))


def test_the_checker_sees_a_cycle_an_upward_import_and_an_unclaimed_module():
    """The checks themselves: a made-up graph with a loop and an edge up must fail them, and a
    new top-level module belongs to no layer until one claims it."""
    edges = {"stoker.worker.a": {"stoker.loader.iterators.b"},
             "stoker.loader.iterators.b": {"stoker.worker.a"}}
    assert _cycles(edges) == [["stoker.loader.iterators.b", "stoker.worker.a"]]
    assert _layer_of("stoker.worker.a") < _layer_of("stoker.loader.iterators.b")
    assert _layer_of("stoker._new_module") is None
    assert _layer_of("stoker") == len(LAYERS) - 1


MAX_LINES = 450  # a module past this does more than one job: split it


def test_no_module_is_over_450_lines():
    long = {}
    for m, path in MODULES.items():
        with open(path) as f:
            n = sum(1 for _ in f)
        if n > MAX_LINES:
            long[m] = n
    assert not long, f"modules over {MAX_LINES} lines (split them): {long}"


def test_nothing_private_is_loose_at_the_package_root():
    """The root holds the public API (``__init__``), the command (``__main__``), the extension
    and its stub; every other module sits in the folder that says which process it runs in."""
    loose = sorted(
        f for f in os.listdir(PACKAGE)
        if f.endswith(".py") and f not in ("__init__.py", "__main__.py")
    )
    assert not loose, f"modules loose at the package root (move them into a folder): {loose}"
