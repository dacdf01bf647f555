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
Pickling the dataset (spawn, forkserver, the node pool, Ray) leaves the handle out; a forked
worker sees the parent's handle as not its own, opens its own, and never touches the parent's
(not even to close it: it is kept, unused, until the worker exits). The threads of one process
share one handle, opened once (``threads_per_worker``: use a client that allows it, or open one
per thread yourself). ``del dataset.table`` drops this process's handle; the next use opens a new
one. ``copy.deepcopy`` of the dataset opens its own too.

Thread contract: any thread; the factory runs under a lock of this process (reentrant: a factory
may use another ``per_worker`` attribute).
"""

from __future__ import annotations

import os
import threading
import weakref

_lock = threading.RLock()
# handles a forked process found from its parent: kept, never used or closed, until it exits
_inherited: list = []


def _after_fork() -> None:
    global _lock
    _lock = threading.RLock()  # (one held by another thread at the fork stays held forever)


os.register_at_fork(after_in_child=_after_fork)


class _Held:
    """A handle and the process it is for, kept by the attribute for one instance (`ref`: a weak
    reference to the instance; None where the instance keeps it in its ``__dict__``, which
    pickles it as nothing held)."""

    __slots__ = ("pid", "value", "ref")

    def __init__(self, pid: int = 0, value=None, ref=None):
        self.pid, self.value, self.ref = pid, value, ref

    def __reduce__(self):
        return _Held, ()

    def __deepcopy__(self, memo):
        return _Held()


class per_worker:  # noqa: N801 (used as a decorator, like functools.cached_property)
    """A dataset attribute opened by ``factory(dataset)`` in each process on first use, never
    pickled, never shared with a forked child (module docstring). The handle is kept beside the
    instance, not in its ``__dict__`` (so the dataset pickles to the same bytes whether or not
    it was opened: the node pool's group key), except for an instance without weak references
    (``__slots__``), whose ``__dict__`` keeps it."""

    def __init__(self, factory):
        if not callable(factory):
            raise TypeError(f"stoker.per_worker takes a function of the dataset, got {factory!r}")
        self.factory = factory
        self.name = getattr(factory, "__name__", "handle")
        self.__doc__ = getattr(factory, "__doc__", None)
        self._held: dict[int, _Held] = {}  # id(instance) -> its handle (copied by fork)

    def __getstate__(self):  # (a class carried by value carries its attributes: no handle)
        return {k: v for k, v in self.__dict__.items() if k != "_held"}

    def __setstate__(self, state) -> None:
        self.__dict__.update(state)
        self._held = {}

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def _key(self) -> str:
        return f"_stoker_per_worker_{self.name}"

    def _find(self, obj) -> _Held | None:
        held = self._held.get(id(obj))
        if held is not None and held.ref() is obj:
            return held
        d = getattr(obj, "__dict__", None)
        return d.get(self._key()) if d is not None else None

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        pid = os.getpid()
        held = self._find(obj)
        if held is not None and held.pid == pid:
            return held.value
        with _lock:
            held = self._find(obj)
            if held is not None and held.pid == pid:
                return held.value
            if held is not None and held.pid:
                _inherited.append(held.value)  # the parent's (a fork): left alone
            value = self.factory(obj)
            self._keep(obj, _Held(pid, value))
            return value

    def _keep(self, obj, held: _Held) -> None:
        key, table = id(obj), self._held
        try:
            held.ref = weakref.ref(obj, lambda _, key=key: table.pop(key, None))
        except TypeError:  # no weak references to it: its __dict__ keeps the handle
            d = getattr(obj, "__dict__", None)
            if d is None:
                raise TypeError(
                    f"stoker.per_worker: {type(obj).__name__} has __slots__ without "
                    "'__weakref__' or '__dict__', so it has nowhere to keep its "
                    f"{self.name!r} handle; add '__weakref__' to its __slots__") from None
            d[self._key()] = held
            return
        table[key] = held

    def __set__(self, obj, value) -> None:
        raise AttributeError(
            f"stoker: {type(obj).__name__}.{self.name} is opened in each process by its "
            f"per_worker factory ({getattr(self.factory, '__qualname__', self.factory)!r}); "
            "it cannot be assigned")

    def __delete__(self, obj) -> None:
        with _lock:
            held = self._find(obj)
            self._held.pop(id(obj), None)
            getattr(obj, "__dict__", {}).pop(self._key(), None)
        if held is not None and held.pid != os.getpid():
            _inherited.append(held.value)

    def opened(self, obj) -> bool:
        """Whether `obj` holds a handle of this process (without opening one)."""
        held = self._find(obj)
        return held is not None and held.pid == os.getpid()
