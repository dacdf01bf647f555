"""What pickle refuses, carried by value: a function or class that the standard pickler cannot
find again by name (a lambda, a closure, a class defined in a function, a class of ``__main__``
when the worker cannot run ``__main__`` again: ``python -c``, a notebook, ``python -m pkg``; or
one defined under the script's ``if __name__ == "__main__":``, which the worker skips) is
pickled by value, with cloudpickle's machinery, by the same pickler as everything around it.
Everything else is pickled exactly as the standard pickler does, byte for byte.

One pickler for the whole pickle (``Pickler``), so that:

- an object reached from the dataset and from a lambda is pickled once and comes back as one
  object (a ``collate_fn`` that reads the dataset sees the worker's dataset, not a copy);
- what stoker's and multiprocessing's rules do for the objects around them (arrays laid beside
  the pickle, a whole ``np.memmap`` as its file, a tensor in shared memory, an ``mp.Queue``'s
  descriptors) they do inside a closure or a class carried by value too;
- a function carried by value whose module the worker has (any module it imports, and the
  script's ``__main__`` when the worker runs the script again) is bound to that module's
  globals there: it reads and writes the worker's module state, and the script's classes it
  names are the worker's own (``isinstance`` holds). Only where the worker has no such module
  (``python -c``, a notebook) do the globals it uses travel with it, shared by every function
  of one pickle.

Used where stoker pickles for its own workers (spawn, forkserver, the node pool: ``engine.sealed``
and ``Carried``), for what a worker sends back (``_pickling``: instances of those classes,
exceptions of them), and to name what cannot be pickled (``dumps``). Never for a checkpoint:
``state_dict()`` holds plain data, loadable with ``weights_only``. Loading runs only what the
parent process (or its own worker) sent a moment before.

Pure functions and per-call picklers: any thread.
"""

from __future__ import annotations

import copyreg
import importlib
import io
import marshal
import os
import pickle
import sys
import types

import cloudpickle

_MISSING = object()


# -- which objects go by value ------------------------------------------------------------------
def needed(obj, to_worker: bool = True) -> bool:
    """Whether `obj` is a function or class that pickling by name would fail to find again in a
    worker (`to_worker`), or, from a worker, in the process that started it: a worker's
    ``__main__`` is its parent's (fork) or the same script run again (spawn), so what it finds
    there by name, its parent does too."""
    if not isinstance(obj, (type, types.FunctionType)):
        return False
    module = getattr(obj, "__module__", None)
    name = getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(name, str):
        return False  # pickle decides, as without stoker
    if to_worker and module == "__main__" and (not _main_runs_again()
                                               or _main_skips(obj, name)):
        return True
    found = sys.modules.get(module, _MISSING)
    if found is _MISSING:
        # pickle imports it, as without stoker; unless no such module can be imported (the
        # made-up module of a namedtuple's __new__, of code compiled from a string)
        return not _importable(module)
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


def _main_skips(obj, qualname: str) -> bool:
    """Whether a worker running the script again (as ``__mp_main__``) would miss `obj`: it is
    bound only under the script's ``if __name__ == "__main__":`` (which the worker skips), or
    defined there. Read from the script's syntax tree (once per file version)."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if not isinstance(path, str):
        return False
    spans, names = _main_script(path)
    if names is not None and qualname.split(".")[0] not in names:
        return True  # (a namedtuple, an Enum or a type() made under the guard: no line)
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


_scripts: dict = {}  # (path, mtime) -> (main guards' line spans, names bound outside them)


def _main_script(path: str) -> tuple:
    """The line spans of the top-level ``if __name__ == "__main__":`` blocks of `path`, and the
    names its top level binds outside them (None when that cannot be known: ``import *``)."""
    try:
        key = (path, os.stat(path).st_mtime_ns)
    except OSError:
        return (), None
    if key not in _scripts:
        import ast

        try:
            with open(path, "rb") as f:
                tree = ast.parse(f.read())
        except (OSError, SyntaxError, ValueError):
            _scripts[key] = ((), None)
            return _scripts[key]
        guards = [n for n in tree.body if isinstance(n, ast.If) and _is_main_test(n.test)]
        names: set | None = set()
        for stmt in tree.body:
            if all(stmt is not g for g in guards):
                names = _bound(stmt, names)
        _scripts[key] = (tuple((g.lineno, g.end_lineno) for g in guards), names)
    return _scripts[key]


def _bound(stmt, names: set | None) -> set | None:
    """`names` with those `stmt` binds at module level (None once a star import makes them
    unknowable)."""
    import ast

    if names is None:
        return None
    if isinstance(stmt, ast.ImportFrom) and any(a.name == "*" for a in stmt.names):
        return None
    for node in ast.walk(stmt):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _is_main_test(test) -> bool:
    import ast

    if not (isinstance(test, ast.Compare) and len(test.ops) == 1
            and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    return any(isinstance(x, ast.Name) and x.id == "__name__" for x in sides) and \
        any(isinstance(x, ast.Constant) and x.value == "__main__" for x in sides)


_found: dict[str, bool] = {}  # top-level package -> found on sys.path


def _module_in_worker(module) -> bool:
    """Whether a worker will have `module` to bind a function's globals to: the script's
    ``__main__`` when the worker runs it again, or a module imported here whose top-level
    package the worker finds on its path (not one made from a file under a name of its own)."""
    if not isinstance(module, str):
        return False
    if module == "__main__":
        return _main_runs_again()
    if module not in sys.modules or module == "__mp_main__":
        return False
    return _importable(module)


def _importable(module: str) -> bool:
    """Whether `module`'s top-level package can be found on this process's path (which a
    spawned worker shares), without importing anything."""
    top = module.split(".")[0]
    found = _found.get(top)
    if found is None:
        from importlib.machinery import PathFinder

        try:
            found = top in sys.builtin_module_names or \
                PathFinder.find_spec(top, sys.path) is not None
        except (ImportError, ValueError):
            found = False
        _found[top] = found
    return found


# -- the pickler ---------------------------------------------------------------------------------
# cloudpickle's reducers for what the standard pickler refuses outright, which classes and
# functions carried by value hold (code, cells, class- and static methods, properties, modules,
# a dataclass's field markers...). Types the standard pickler takes (loggers, bound methods,
# TypeVars) keep its rules, so what pickles today pickles to the same bytes; open files and
# memoryviews stay refused (copying a file's or a mapping's contents is not sending it).
def _refused() -> set:
    import abc
    import collections
    import dataclasses
    import weakref

    views = [type(getattr(d, k)()) for d in ({}, collections.OrderedDict())
             for k in ("keys", "values", "items")]
    return {classmethod, staticmethod, property, types.CellType, types.CodeType,
            types.GetSetDescriptorType, types.ModuleType, types.MappingProxyType,
            weakref.WeakSet, abc.abstractclassmethod, abc.abstractstaticmethod,
            abc.abstractproperty, dataclasses._FIELD_BASE, *views}


def _code_reduce(code):
    """A code object as marshal writes it: whole, its file name kept (a traceback in the worker
    names the file and line), read back by the same interpreter (a worker runs this one)."""
    return marshal.loads, (marshal.dumps(code),)


_REFUSED = _refused()
_CLOUD_REDUCERS = {t: r for t, r in cloudpickle.Pickler._dispatch_table.items()
                   if t in _REFUSED}
_CLOUD_REDUCERS[types.CodeType] = _code_reduce


class Pickler(cloudpickle.Pickler):
    """``pickle.Pickler`` that sends by value exactly the functions and classes ``needed``
    names, and otherwise pickles as the standard one; with ``forking``, multiprocessing's
    reductions apply, as when ``Process.start()`` pickles (``ForkingPickler``'s table).
    Subclasses add rules for other objects in ``reduce_other``; ``to_worker`` says which way
    the pickle goes (``needed``)."""

    to_worker = True

    def __init__(self, file, protocol=pickle.HIGHEST_PROTOCOL, buffer_callback=None,
                 forking: bool = False):
        table = dict(copyreg.dispatch_table)
        table.update(_CLOUD_REDUCERS)
        if forking:
            from multiprocessing import reduction

            table.update(reduction.ForkingPickler._extra_reducers)
        # Before the pickler's __init__, which reads it (cloudpickle's class attribute of the
        # same name would win after): one plain dict, looked up at C speed.
        self.dispatch_table = table
        super().__init__(file, protocol=protocol, buffer_callback=buffer_callback)

    def reducer_override(self, obj):
        if isinstance(obj, (type, types.FunctionType)):
            if not needed(obj, self.to_worker):
                return NotImplemented  # by name, as the standard pickler does
            if isinstance(obj, types.FunctionType) and self.to_worker and \
                    _module_in_worker(obj.__module__):
                return _function_in_module(obj)
            return super().reducer_override(obj)  # cloudpickle's, by value
        return self.reduce_other(obj)

    def reduce_other(self, obj):
        return NotImplemented


def _function_in_module(func):
    """A function by value, its globals those of its module in the worker: its code, name,
    defaults and closure travel; what it reads and writes of its module is the worker's. Of
    the script's globals it uses, those the worker's run of the script lacks (bound only under
    its main guard) travel with it and are added to the worker's ``__main__``."""
    cells = func.__closure__ or ()
    state = {"defaults": func.__defaults__, "kwdefaults": func.__kwdefaults__,
             "qualname": func.__qualname__, "doc": func.__doc__, "dict": dict(func.__dict__),
             "annotations": func.__annotations__, "globals": _missing_globals(func),
             "closure": [c.cell_contents if _filled(c) else _MISSING_CELL for c in cells]}
    return (_make_function, (func.__module__, func.__code__, func.__name__, len(cells)), state,
            None, None, _fill_function)


def _missing_globals(func) -> tuple[dict, bool]:
    """The globals `func` uses that a worker running the script again would not have, and
    whether they replace what the worker's ``__main__`` holds under those names: those bound
    only under the main guard do (a worker forked from a rank's copy, in the node pool, holds
    that rank's); when the script's names cannot be told, all it uses that are not modules
    travel, and fill in only what the worker lacks."""
    if func.__module__ != "__main__":
        return {}, False
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    names = _main_script(path)[1] if isinstance(path, str) else None
    out = {}
    for name in _names_used(func.__code__):
        value = func.__globals__.get(name, _MISSING)
        if value is _MISSING or isinstance(value, types.ModuleType):
            continue
        if names is None or name not in names:
            out[name] = value
    return out, names is not None


def _names_used(code) -> set:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names_used(const)
    return names


class _EmptyCell:
    def __reduce__(self):
        return "_MISSING_CELL"


_MISSING_CELL = _EmptyCell()


def _filled(cell) -> bool:
    try:
        return cell.cell_contents is not _MISSING  # (reading an empty cell raises)
    except ValueError:
        return False


def _make_function(module: str, code, name: str, cells: int):
    mod = sys.modules.get(module) or importlib.import_module(module)
    closure = tuple(types.CellType() for _ in range(cells)) or None
    return types.FunctionType(code, mod.__dict__, name, None, closure)


def _fill_function(func, state: dict) -> None:
    """The rest of a function, set once it exists (a closure may refer to the function)."""
    func.__defaults__ = state["defaults"]
    func.__kwdefaults__ = state["kwdefaults"]
    func.__qualname__ = state["qualname"]
    func.__doc__ = state["doc"]
    func.__dict__.update(state["dict"])
    func.__annotations__ = state["annotations"]
    values, replace = state["globals"]
    for name, value in values.items():
        if replace:
            func.__globals__[name] = value
        else:
            func.__globals__.setdefault(name, value)  # (the worker's own, where it has one)
    for cell, value in zip(func.__closure__ or (), state["closure"]):
        if value is not _MISSING_CELL:
            cell.cell_contents = value


class _Probe:
    """Stands for the Popen being started while ``dumps`` pickles, so that what pickles only
    while a process starts (multiprocessing's locks, Values and Queues; a descriptor) pickles
    as it would then."""

    def duplicate_for_child(self, fd: int) -> int:
        return fd

    @staticmethod
    def DupFd(fd: int):  # noqa: N802 (multiprocessing's name)
        return None


def dumps(obj) -> bytes:
    """`obj` pickled as ``Process.start()`` pickles it under spawn (multiprocessing's reductions:
    torch's shared tensors stay shared), what pickle refuses by name by value; raises what
    pickling raises."""
    from multiprocessing import context

    buf = io.BytesIO()
    probe = None
    if context.get_spawning_popen() is None:
        probe = _Probe()
        context.set_spawning_popen(probe)
    try:
        Pickler(buf, forking=True).dump(obj)
    finally:
        if probe is not None:
            context.set_spawning_popen(None)
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
