"""What a spawned worker's run of the script will have: a worker started with spawn or
forkserver runs the parent's script again as ``__mp_main__`` (multiprocessing's rule: a script
file, or a ``-m`` module other than a package's ``__main__``), skipping what is under its
``if __name__ == "__main__":``. Read from the script's syntax tree, once per file version.

Used by ``pickling.by_value`` to tell which of ``__main__``'s functions, classes and globals a worker
finds there by name. Pure functions (a cache of parsed scripts); any thread.
"""

from __future__ import annotations

import ast
import os
import sys


def runs_again() -> bool:
    """Whether a spawned worker runs this process's ``__main__`` again, so that what its top
    level binds is found there by name."""
    main = sys.modules.get("__main__")
    spec_name = getattr(getattr(main, "__spec__", None), "name", None)
    if spec_name is not None:
        return not (spec_name == "__main__" or spec_name.endswith(".__main__"))
    path = getattr(main, "__file__", None)
    return isinstance(path, str) and os.path.basename(path) != "ipython" and \
        os.path.exists(path)


def path() -> str | None:
    p = getattr(sys.modules.get("__main__"), "__file__", None)
    return p if isinstance(p, str) else None


_scripts: dict = {}  # (path, mtime) -> (main guards' line spans, names bound outside them)


def read(script: str) -> tuple:
    """The line spans of the top-level ``if __name__ == "__main__":`` blocks of `script`, and
    the names its top level binds outside them (None when that cannot be known: a star import,
    a script that does not parse)."""
    try:
        key = (script, os.stat(script).st_mtime_ns)
    except OSError:
        return (), None
    if key not in _scripts:
        try:
            with open(script, "rb") as f:
                tree = ast.parse(f.read())
        except (OSError, SyntaxError, ValueError):
            _scripts[key] = ((), None)
            return _scripts[key]
        guards = [n for n in tree.body if isinstance(n, ast.If) and _is_main_test(n.test)]
        names: set | None = set()
        for stmt in tree.body:
            if names is not None and all(stmt is not g for g in guards):
                names = _bound(stmt, names)
        _scripts[key] = (tuple((g.lineno, g.end_lineno) for g in guards), names)
    return _scripts[key]


def _bound(stmt, names: set) -> set | None:
    """`names` with those `stmt` binds in the module's namespace: its own targets, and those
    of the statements it holds (an ``if``, ``for``, ``with``, ``try`` at the top level), never
    those inside a function's or a class's body (their own namespaces). None once a star import
    makes them unknowable."""
    if isinstance(stmt, ast.ImportFrom) and any(a.name == "*" for a in stmt.names):
        return None
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        names.add(stmt.name)
        return names
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        names.update((a.asname or a.name).split(".")[0] for a in stmt.names)
        return names
    targets: list = []
    if isinstance(stmt, ast.Assign):
        targets = [*stmt.targets, stmt.value]
    elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
        targets = [stmt.target] + ([stmt.value] if stmt.value is not None else [])
    elif isinstance(stmt, (ast.For, ast.AsyncFor)):
        targets = [stmt.target, stmt.iter]
    elif isinstance(stmt, (ast.With, ast.AsyncWith)):
        targets = [i.optional_vars for i in stmt.items if i.optional_vars is not None]
    elif isinstance(stmt, (ast.Expr, ast.If, ast.While)):
        targets = [stmt.value if isinstance(stmt, ast.Expr) else stmt.test]  # (a walrus)
    for t in targets:
        _stored(t, names)
    blocks = [getattr(stmt, f, []) for f in ("body", "orelse", "finalbody")]
    for handler in getattr(stmt, "handlers", []):
        if handler.name:
            names.add(handler.name)
        blocks.append(handler.body)
    for case in getattr(stmt, "cases", []):
        blocks.append(case.body)
        for n in ast.walk(case.pattern):  # (a capture: `case Point(x=px)`, `case [*rest]`)
            name = getattr(n, "name", None)
            if isinstance(name, str):
                names.add(name)
    for block in blocks:
        for child in block:
            if _bound(child, names) is None:
                return None
    return names


def _stored(node, names: set) -> None:
    """The names `node` (a target, or an expression that may hold a walrus) stores, not
    counting what a lambda binds for itself."""
    if isinstance(node, ast.Lambda):
        return
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
        names.add(node.id)
    for child in ast.iter_child_nodes(node):
        _stored(child, names)


def _is_main_test(test) -> bool:
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1
            and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    return any(isinstance(x, ast.Name) and x.id == "__name__" for x in sides) and \
        any(isinstance(x, ast.Constant) and x.value == "__main__" for x in sides)


def skips(obj, qualname: str) -> bool:
    """Whether the worker's run of the script would miss `obj` of ``__main__`` (`qualname`):
    its name is bound only under the main guard (a namedtuple, an Enum, a ``type(...)`` made
    there: no line of their own), or it was defined there."""
    script = path()
    if script is None:
        return False
    spans, names = read(script)
    if names is not None and qualname.split(".")[0] not in names:
        return True
    line = _first_line(obj)
    return line is not None and any(a <= line <= b for a, b in spans)


def bound_outside_guards() -> set | None:
    """The names the worker's run of the script binds (None: unknowable, or no script)."""
    script = path()
    return read(script)[1] if script is not None else None


def _first_line(obj) -> int | None:
    code = getattr(obj, "__code__", None)
    if code is not None:
        return code.co_firstlineno
    line = getattr(obj, "__firstlineno__", None)  # a class, Python 3.13 and later
    if isinstance(line, int):
        return line
    import inspect

    try:
        return inspect.findsource(obj)[1] + 1
    except (OSError, TypeError):
        return None
