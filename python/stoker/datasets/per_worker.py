"""``stoker.per_worker``: an attribute of a dataset that each process opens for itself, never
copied: a database connection, an HTTP pool, a Lance or LanceDB table, a client of a Rust or Go
runtime, a file handle — anything that is not safe to use after ``fork`` or cannot be pickled.

    class Frames(Dataset):
        def __init__(self, uri):
            self.uri = uri

        @stoker.per_worker
        def table(self):
            return lance.dataset(self.uri)

        def __getitem__(self, i):
            return self.table.take([i]).to_pylist()[0]

The factory runs on first use in each process: in the main process (``num_workers=0``, or code
that reads the dataset there), in each worker, and in a worker started again after a death.
Pickling the dataset (spawn, forkserver, the node pool, Ray), copying it (``copy.copy``,
``copy.deepcopy``) leave the handle out: the copy opens its own. A forked worker sees the
parent's handle as not its own, opens its own, and never touches the parent's (not even to close
it: it is kept, unused, until the worker exits). The threads of one process share one handle,
opened once (``threads_per_worker``: use a client that allows it, or open one per thread
yourself). ``del dataset.table`` drops this process's handle; the next use opens a new one.

The handle lives in the instance's ``__dict__`` (as ``functools.cached_property``'s value does,
so a handle that refers back to its dataset is collected with it), and the class gets a
``__getstate__`` that leaves it out, so that a dataset pickles to the same bytes whether or not
it was opened (the node pool groups ranks by those bytes). A class with pickling of its own
(``__getstate__``, ``__reduce__``) keeps it: its handles then pickle as "none opened".

Thread contract: any thread. A factory runs under a lock of its own attribute and instance, so
one that waits for threads which use the dataset's other ``per_worker`` attributes does not
deadlock; a second thread that wants the same attribute waits for the first one's factory.
"""

from __future__ import annotations

import copyreg
import os
import sys
import threading
import weakref

_PREFIX = "_stoker_per_worker_"
_table_lock = threading.Lock()  # makes an attribute's record; held for no factory
# handles a forked process found from its parent: kept, never used or closed, until it exits
_inherited: list = []


def _after_fork() -> None:
    global _table_lock
    _table_lock = threading.Lock()  # (one held by another thread at the fork stays held)


os.register_at_fork(after_in_child=_after_fork)


class _Held:
    """One attribute of one instance in one process: its handle once opened, and the lock its
    factory runs under. Pickles and copies as nothing held."""

    __slots__ = ("pid", "owner", "value", "opened", "lock")

    def __init__(self, owner=None):
        self.pid = os.getpid()
        self.owner = _ref(owner)  # the instance it is for (a shallow copy's is another)
        self.value = None
        self.opened = False
        self.lock = threading.RLock()

    def mine(self, obj) -> bool:
        return self.pid == os.getpid() and self.owner is not None and self.owner() is obj

    def __reduce__(self):
        return _Held, ()

    def __copy__(self):
        return _Held()

    def __deepcopy__(self, memo):
        return _Held()


class per_worker:  # noqa: N801 (used as a decorator, like functools.cached_property)
    """A dataset attribute opened by ``factory(dataset)`` in each process on first use, never
    pickled, never shared with a forked child (module docstring)."""

    def __init__(self, factory):
        if not callable(factory):
            raise TypeError(f"stoker.per_worker takes a function of the dataset, got {factory!r}")
        self.factory = factory
        self.name = getattr(factory, "__name__", "handle")
        self.key = _PREFIX + self.name
        self.__doc__ = getattr(factory, "__doc__", None)

    def __set_name__(self, owner, name: str) -> None:
        self.name = name
        # (a subclass's attribute of the same name is another one: its own key)
        self.key = f"{_PREFIX}{owner.__qualname__}.{name}"
        _leave_out_of_pickles(owner)

    def _record(self, obj) -> _Held:
        d = getattr(obj, "__dict__", None)
        if d is None:
            raise TypeError(
                f"stoker.per_worker: {type(obj).__name__} has __slots__ without '__dict__', so "
                f"it has nowhere to keep its {self.name!r} handle; add '__dict__' to its "
                "__slots__")
        held = d.get(self.key)
        if held is None or not held.mine(obj):
            with _table_lock:
                held = d.get(self.key)
                if held is None or not held.mine(obj):
                    if held is not None and held.opened and held.pid != os.getpid():
                        _inherited.append(held.value)  # the parent's (a fork): left alone
                    held = d[self.key] = _Held(obj)
        return held

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        held = self._record(obj)
        if held.opened:
            return held.value
        with held.lock:
            if not held.opened:
                held.value = self.factory(obj)
                held.opened = True
            return held.value

    def __set__(self, obj, value) -> None:
        raise AttributeError(
            f"stoker: {type(obj).__name__}.{self.name} is opened in each process by its "
            f"per_worker factory ({getattr(self.factory, '__qualname__', self.factory)!r}); "
            "it cannot be assigned")

    def __delete__(self, obj) -> None:
        held = getattr(obj, "__dict__", {}).pop(self.key, None)
        if held is not None and held.opened and held.pid != os.getpid():
            _inherited.append(held.value)

    def opened(self, obj) -> bool:
        """Whether `obj` holds a handle of this process (without opening one)."""
        held = getattr(obj, "__dict__", {}).get(self.key)
        return held is not None and held.opened and held.mine(obj)


def _ref(obj):
    """A weak reference to `obj`, or (no weak references to it) a callable that returns it
    (then held strongly: the record is in its own __dict__, a cycle the collector frees)."""
    if obj is None:
        return None
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


def _leave_out_of_pickles(owner) -> None:
    """Gives `owner` a ``__getstate__`` without the handles, unless it (or a base) pickles in a
    way of its own."""
    for cls in owner.__mro__[:-1]:
        if cls.__dict__.get("__getstate__") is _getstate:
            return
        if any(k in cls.__dict__ for k in ("__getstate__", "__reduce__", "__reduce_ex__")):
            return
    owner.__getstate__ = _getstate


def _getstate(self):
    """The instance's state as the default pickling makes it, less its per_worker handles."""
    if sys.version_info >= (3, 11):
        state = object.__getstate__(self)
    else:
        d = self.__dict__ or None
        slots = {n: getattr(self, n) for n in copyreg._slotnames(type(self))
                 if hasattr(self, n)}
        state = (d, slots) if slots else d
    d = state[0] if isinstance(state, tuple) else state
    if isinstance(d, dict) and any(k.startswith(_PREFIX) for k in d):
        d = {k: v for k, v in d.items() if not k.startswith(_PREFIX)} or None
        state = (d, state[1]) if isinstance(state, tuple) else d
    return state
