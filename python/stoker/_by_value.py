"""What pickle refuses, carried by value: a function or class that the standard pickler cannot
find again by name (a lambda, a closure, a class defined in a function, a class of ``__main__``
when the worker cannot run ``__main__`` again: ``python -c``, a notebook, ``python -m pkg``; or
one defined under the script's ``if __name__ == "__main__":``, which the worker skips) is
pickled with cloudpickle, by value, inside the standard pickle. Everything else is pickled exactly
as the standard pickler does, byte for byte: the check runs only for functions and classes, and
says "by value" only where pickling by name would fail.

Used where stoker pickles for its own workers (spawn, forkserver, the node pool): the sealed
dataset (``engine.sealed``), the per-worker pickle (``Carried``), and the naming of what cannot be
pickled (``dumps``). Never for a checkpoint: ``state_dict()`` holds plain data, loadable with
``weights_only``. Loading runs only what the parent process sent its own workers.

Pure functions: any thread.
"""

from __future__ import annotations

import io
import os
import pickle
import sys
import types

_MISSING = object()


def needed(obj) -> bool:
    """Whether `obj` is a function or class that pickling by name would fail to find again."""
    if not isinstance(obj, (type, types.FunctionType)):
        return False
    module = getattr(obj, "__module__", None)
    name = getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(name, str):
        return False  # pickle decides, as without stoker
    if module == "__main__" and (not _main_runs_again() or _under_main_guard(obj)):
        return True
    found = sys.modules.get(module, _MISSING)
    if found is _MISSING:
        return False  # pickle imports it, as without stoker
    for part in name.split("."):
        if part == "<locals>":
            return True
        found = getattr(found, part, _MISSING)
        if found is _MISSING:
            return True
    return found is not obj


def _main_runs_again() -> bool:
    """Whether a spawned worker runs this process's ``__main__`` again (multiprocessing's rule:
    a module run with ``-m``, or a script file), so that its classes are found there by name."""
    main = sys.modules.get("__main__")
    spec_name = getattr(getattr(main, "__spec__", None), "name", None)
    if spec_name is not None:
        return not (spec_name == "__main__" or spec_name.endswith(".__main__"))
    path = getattr(main, "__file__", None)
    return isinstance(path, str) and os.path.basename(path) != "ipython" and \
        os.path.exists(path)


def _under_main_guard(obj) -> bool:
    """Whether `obj` was defined inside the script's ``if __name__ == "__main__":`` block, which
    a spawned worker skips when it runs the script again (as ``__mp_main__``): found here by
    name, missing there."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    spans = _main_guards(path) if isinstance(path, str) else ()
    if not spans:
        return False
    line = _first_line(obj)
    return line is not None and any(a <= line <= b for a, b in spans)


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


_guards: dict = {}  # (path, mtime) -> the line spans of the script's main guards


def _main_guards(path: str) -> tuple:
    """The line spans of the top-level ``if __name__ == "__main__":`` blocks of `path`."""
    try:
        key = (path, os.stat(path).st_mtime_ns)
    except OSError:
        return ()
    if key not in _guards:
        import ast

        try:
            with open(path, "rb") as f:
                tree = ast.parse(f.read())
        except (OSError, SyntaxError, ValueError):
            tree = ast.Module(body=[], type_ignores=[])
        _guards[key] = tuple((n.lineno, n.end_lineno) for n in tree.body
                             if isinstance(n, ast.If) and _is_main_test(n.test))
    return _guards[key]


def _is_main_test(test) -> bool:
    import ast

    if not (isinstance(test, ast.Compare) and len(test.ops) == 1
            and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    return any(isinstance(x, ast.Name) and x.id == "__name__" for x in sides) and \
        any(isinstance(x, ast.Constant) and x.value == "__main__" for x in sides)


def reduce(obj):
    """The reduction of `obj` (``needed(obj)``): cloudpickle's bytes of it, loaded back with
    ``pickle.loads`` in the worker. cloudpickle keeps one class per process however many times it
    is loaded, so the dataset's class and a collate_fn's reference to it stay one class."""
    import cloudpickle

    return _rebuild, (cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL),)


def _rebuild(data: bytes):
    return pickle.loads(data)


class Pickling:
    """Mixin for a ``pickle.Pickler`` subclass: functions and classes that ``needed`` names go by
    value; everything else to the next ``reducer_override`` in line (or the standard rules)."""

    def reducer_override(self, obj):
        if isinstance(obj, (type, types.FunctionType)) and needed(obj):
            return reduce(obj)
        nxt = getattr(super(), "reducer_override", None)
        return NotImplemented if nxt is None else nxt(obj)


def _forking_pickler():
    from multiprocessing import reduction

    class _ForkingByValue(Pickling, reduction.ForkingPickler):
        pass

    return _ForkingByValue


def dumps(obj) -> bytes:
    """`obj` pickled as ``Process.start()`` pickles it (multiprocessing's reductions: torch's
    shared tensors stay shared) and what pickle refuses by value; raises what pickling raises."""
    buf = io.BytesIO()
    _forking_pickler()(buf, pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


class Carried:
    """`objects` pickled for one worker as it starts (the per-worker pickle of spawn and
    forkserver, when the dataset cannot be pickled once for all: ``sealed.PerWorker``), with
    the rule above; ``Process.start()`` pickles it, multiprocessing's reductions still apply
    (descriptors, CUDA tensors). The worker calls ``load``."""

    def __init__(self, objects):
        self.objects = objects

    def __reduce__(self):
        return _carried, (dumps(self.objects),)

    def load(self):
        return self.objects


def _carried(data: bytes) -> Carried:
    return Carried(pickle.loads(data))
