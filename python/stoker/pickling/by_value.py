"""What pickle refuses, carried by value: a function or class (or a ``TypeVar``) that the
standard pickler cannot find again by name in a worker (a lambda, a closure, a class defined in
a function, a class of ``__main__`` when the worker cannot run ``__main__`` again: ``python
-c``, a notebook, ``python -m pkg``; or one bound only under the script's ``if __name__ ==
"__main__":``, which the worker skips) is pickled by value, by the same pickler as everything
around it. Everything else is pickled exactly as the standard pickler does, byte for byte.

One pickler for the whole pickle (``Pickler``, built on cloudpickle's), so that:

- an object reached from the dataset and from a lambda is pickled once and is one object in
  the worker; closures that share a variable (``nonlocal``) still share it there;
- stoker's and multiprocessing's rules for the objects around them (arrays laid beside the
  pickle, a whole ``np.memmap`` as its file, a tensor in shared memory, an ``mp.Queue``'s
  descriptors) hold inside a closure or a class carried by value too;
- a function whose globals are its module's, and whose module the worker has (a module
  imported here that the worker finds on its path, or the script's ``__main__`` when the worker
  runs the script again), is rebuilt bound to that module's globals there: it reads and writes
  the worker's module state, and the classes it names are the worker's own. Of the script's
  globals it uses, those bound only under the main guard travel with it. Any other function
  (``python -c``, a notebook, globals of its own: attrs' generated methods, ``exec``) takes the
  globals it uses with it, one dict for every function that shared them here.

Toward the parent (what a worker sends back, ``to_worker=False``), a class is named by the id
cloudpickle gave it when the parent sent it by value: the parent's own class comes back, its
methods and attributes untouched; a class the parent never sent that way fails to pickle, as it
always did.

Used where stoker pickles for its own workers (spawn, forkserver, the node pool: ``wire.sealed``
and ``Carried``), for what a worker sends back (``pickling.pickler``), and to name what cannot be pickled
(``dumps``). Never for a checkpoint: ``state_dict()`` holds plain data, loadable with
``weights_only``. Loading runs only what the parent process (or its own worker) sent a moment
before.

Pure functions and per-call picklers: any thread.
"""

from __future__ import annotations

import copyreg
import dis
import functools
import importlib
import io
import marshal
import pickle
import sys
import types
import typing
import weakref
from multiprocessing import reduction as _mp_reduction

import cloudpickle
from cloudpickle import cloudpickle as _cp

from . import main_script as _main_script

_MISSING = object()


# -- which objects go by value ------------------------------------------------------------------
def needed(obj, to_worker: bool = True) -> bool:
    """Whether `obj` is a function or class (or a TypeVar) that pickling by name would fail to
    find again in a worker (`to_worker`), or, from a worker, in the process that started it: a
    worker's ``__main__`` is its parent's (fork) or the same script run again (spawn), so what
    it finds there by name, its parent does too."""
    if not isinstance(obj, (type, types.FunctionType, typing.TypeVar)):
        return False
    module = getattr(obj, "__module__", None)
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if module is None and isinstance(obj, types.FunctionType):
        return True  # (code exec'd into a namespace of its own: nothing to find it by)
    if not isinstance(module, str) or not isinstance(name, str):
        return False  # pickle decides, as without stoker
    if to_worker and module == "__main__" and (not _main_script.runs_again()
                                               or _main_script.skips(obj, name)):
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


_found: dict[str, bool] = {}  # top-level package -> found on sys.path


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


def _home_in_worker(func) -> str | None:
    """The module a worker will have to bind `func`'s globals to: the one its globals are,
    when the worker finds it (the script's ``__main__`` when the worker runs it again); else
    None (its globals travel with it)."""
    module = func.__module__
    mod = sys.modules.get(module) if isinstance(module, str) else None
    if mod is None or func.__globals__ is not getattr(mod, "__dict__", None):
        return None
    if module == "__main__":
        return module if _main_script.runs_again() else None
    if module == "__mp_main__" or not _importable(module):
        return None
    return module


# -- the pickler ---------------------------------------------------------------------------------
def _refused() -> set:
    """The types the standard pickler refuses outright that classes and functions carried by
    value hold (and a dataclass's field markers, which it copies: a by-value dataclass's
    ``fields()`` must recognise them)."""
    import abc
    import collections
    import dataclasses

    empty: list[dict] = [{}, collections.OrderedDict()]
    views = [type(getattr(d, k)()) for d in empty for k in ("keys", "values", "items")]
    return {classmethod, staticmethod, property, types.GetSetDescriptorType, types.ModuleType,
            types.MappingProxyType, weakref.WeakSet, abc.abstractclassmethod,
            abc.abstractstaticmethod, abc.abstractproperty,
            type(dataclasses._FIELD), *views}  # type: ignore[attr-defined]


def _code_reduce(code):
    """A code object as marshal writes it: whole, its file name kept (a traceback in the worker
    names the file and line), read back by the same interpreter (a worker runs this one)."""
    return marshal.loads, (marshal.dumps(code),)


def _cell_reduce(cell):
    """An empty cell: what it holds is set by the function that owns it, once that function
    exists (``_fill_function``), so closures that share a cell share it in the worker too."""
    return types.CellType, ()


def _cached_property_reduce(prop):
    """``functools.cached_property`` of a class carried by value (Python 3.11's holds a lock)."""
    return _make_cached_property, (prop.func, prop.attrname, prop.__doc__)


def _make_cached_property(func, attrname, doc):
    prop = functools.cached_property(func)
    prop.attrname, prop.__doc__ = attrname, doc
    return prop


_REDUCERS = {t: r for refused in [_refused()]
             for t, r in cloudpickle.Pickler._dispatch_table.items() if t in refused}
_REDUCERS.update({types.CodeType: _code_reduce, types.CellType: _cell_reduce})
if sys.version_info < (3, 12):  # (later ones hold no lock: the standard pickler takes them)
    _REDUCERS[functools.cached_property] = _cached_property_reduce
_tables: dict = {}  # forking -> copies of the tables it was built from, and the table


def _table(forking: bool) -> dict:
    """The dispatch table: the standard one (and multiprocessing's reductions for a pickle to
    a starting process) with the reducers above; rebuilt when a reducer is registered or
    replaced (copyreg.pickle), as each standard Pickler would read the tables anew."""
    extra = _mp_reduction.ForkingPickler._extra_reducers if forking else {}  # type: ignore
    kept = _tables.get(forking)
    if kept is None or kept[0] != copyreg.dispatch_table or kept[1] != extra:
        table = dict(copyreg.dispatch_table)
        table.update(_REDUCERS)
        table.update(extra)
        _tables[forking] = kept = (dict(copyreg.dispatch_table), dict(extra), table)
    return kept[2]


class Pickler(cloudpickle.Pickler):
    """``pickle.Pickler`` that sends by value exactly what ``needed`` names, and otherwise
    pickles as the standard one; with ``forking``, multiprocessing's reductions apply, as when
    ``Process.start()`` pickles (``ForkingPickler``'s table). Subclasses add rules for other
    objects in ``reduce_other``; ``to_worker`` says which way the pickle goes."""

    to_worker = True

    def __init__(self, file, protocol=pickle.HIGHEST_PROTOCOL, buffer_callback=None,
                 forking: bool = False):
        # Before the pickler's __init__, which reads it (cloudpickle's class attribute of the
        # same name would win after): one plain dict, looked up at C speed.
        self.dispatch_table = _table(forking)
        self._forking = forking
        super().__init__(file, protocol=protocol, buffer_callback=buffer_callback)
        self._globals: dict[int, dict] = {}  # id(a function's globals) -> the dict sent

    def stale(self) -> bool:
        """Whether a reducer was registered or replaced since this pickler was made (one
        reused)."""
        return _table(self._forking) is not self.dispatch_table

    def forget_globals(self) -> None:
        """Before another pickle by this pickler (its memo cleared too)."""
        self._globals.clear()

    def reducer_override(self, obj):
        if isinstance(obj, (type, types.FunctionType, typing.TypeVar)):
            if not needed(obj, self.to_worker):
                return NotImplemented  # by name, as the standard pickler does
            if not self.to_worker:
                return _toward_parent(obj)
            if isinstance(obj, types.FunctionType):
                return self._function(obj)
            if isinstance(obj, typing.TypeVar):
                return _cp._typevar_reduce(obj)
            return super().reducer_override(obj)  # cloudpickle's class reduction, by value
        if type(obj) is _LRU and self.to_worker and needed(obj.__wrapped__):
            return _make_lru, (obj.__wrapped__, obj.cache_parameters())  # (a local one)
        return self.reduce_other(obj)

    def reduce_other(self, obj):
        return NotImplemented

    def _function(self, func):
        """A function by value: created from its code bound to its module's globals in the
        worker, or to a dict of the globals it uses (one per namespace it came from); the rest
        (defaults, closure contents, attributes, those globals) set once it exists."""
        home = _home_in_worker(func)
        replace = True  # (the dict sent is the function's own; guard-only names are missing)
        if home is not None:
            scope, names = ("module", home), []
            if home == "__main__":  # the names it uses the worker's run of the script lacks
                bound = _main_script.bound_outside_guards()
                names = [n for n in _globals_used(func.__code__) if bound is None or n not in bound]
                # where the script's names are unknowable, all it uses travel, and fill in only
                # what the worker's module lacks
                replace = bound is not None
        else:
            base = self._globals.get(id(func.__globals__))
            if base is None:
                base = self._globals[id(func.__globals__)] = {
                    k: func.__globals__[k] for k in ("__package__", "__name__", "__file__")
                    if k in func.__globals__}
            scope, names = ("dict", base), _globals_used(func.__code__)
        g = func.__globals__
        state = {"defaults": func.__defaults__, "kwdefaults": func.__kwdefaults__,
                 "qualname": func.__qualname__, "module": func.__module__,
                 "doc": func.__doc__, "dict": dict(func.__dict__),
                 "globals": {n: g[n] for n in names if n in g}, "replace": replace,
                 "cells": [_contents(c) for c in func.__closure__ or ()],
                 "type_params": getattr(func, "__type_params__", ())}
        if sys.version_info < (3, 14):  # (3.14 evaluates them lazily: they may name
            state["annotations"] = func.__annotations__  # what only a type checker sees)
        return (_make_function, (scope, func.__code__, func.__name__, func.__closure__),
                state, None, None, _fill_function)


_LRU = type(functools.lru_cache(None)(len))


def _make_lru(func, parameters: dict):
    """``functools.lru_cache`` of a function carried by value (an empty cache, as a worker's
    own would start with)."""
    return functools.lru_cache(maxsize=parameters["maxsize"], typed=parameters["typed"])(func)


def _toward_parent(obj):
    """A class the parent sent this worker by value goes back as a reference to the parent's
    class (cloudpickle's id for it); anything else takes the standard path (and fails there,
    as it always did)."""
    if isinstance(obj, type):
        tracker = _cp._DYNAMIC_CLASS_TRACKER_BY_CLASS.get(obj)
        if tracker is not None:
            return _tracked_class, (tracker, obj.__qualname__)
    return NotImplemented


def _tracked_class(tracker: str, qualname: str):
    cls = _cp._DYNAMIC_CLASS_TRACKER_BY_ID.get(tracker)
    if cls is None:
        raise pickle.UnpicklingError(
            f"stoker: a worker sent an instance of {qualname}, a class this process did not "
            "send it (one the worker made itself cannot come back by name)")
    return cls


_USED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # code -> _globals_used


def _globals_used(code) -> list:
    """The global names `code` (and the code nested in it) reads, writes or deletes, sorted:
    the pickle's bytes are the same in every process whatever its PYTHONHASHSEED (the node
    pool's group key is their hash), read once per code object."""
    names = _USED.get(code)
    if names is None:
        names = _USED[code] = sorted(_names_in(code))
    return names


def _names_in(code) -> set:
    names = {i.argval for i in dis.get_instructions(code)
             if i.opname in ("LOAD_GLOBAL", "STORE_GLOBAL", "DELETE_GLOBAL")}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names_in(const)
    return names


class _Empty:
    """An empty cell's contents (a variable not yet assigned)."""

    def __reduce__(self):
        return "_EMPTY"


_EMPTY = _Empty()


def _contents(cell):
    try:
        return cell.cell_contents
    except ValueError:
        return _EMPTY


def _make_function(scope: tuple, code, name: str, closure):
    kind, where = scope
    if kind == "module":
        where = (sys.modules.get(where) or importlib.import_module(where)).__dict__
    where.setdefault("__builtins__", __builtins__)
    return types.FunctionType(code, where, name, None, closure)


def _fill_function(func, state: dict) -> None:
    """The rest of a function, set once it exists (its closure may refer to it)."""
    func.__defaults__ = state["defaults"]
    func.__kwdefaults__ = state["kwdefaults"]
    func.__qualname__ = state["qualname"]
    func.__module__ = state["module"]
    func.__doc__ = state["doc"]
    func.__dict__.update(state["dict"])
    if "annotations" in state:
        func.__annotations__ = state["annotations"]
    if state["type_params"]:
        func.__type_params__ = state["type_params"]
    if state["replace"]:
        func.__globals__.update(state["globals"])
    else:
        for name, value in state["globals"].items():
            func.__globals__.setdefault(name, value)
    for cell, value in zip(func.__closure__ or (), state["cells"]):
        if value is not _EMPTY:
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
        context.set_spawning_popen(probe)  # type: ignore[arg-type]  # (its protocol)
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
