"""The GIL on a free-threaded Python: whether it is on, and which module turned it back on.

On a free-threaded build (3.13t, 3.14t) the GIL starts off. The interpreter turns it back on, for
the rest of the process, when it imports an extension module that has not declared that it runs
without it, and says so once, in a RuntimeWarning that names the module ("The global interpreter
lock (GIL) has been enabled to load module 'X', ..."). From then on stoker's threads
(``threads_per_worker``, and ``num_workers=0`` with threads) take turns on one core instead of
computing side by side.

``watch()`` (``import stoker`` runs it first) notes the module that warning names, while the GIL
is still off. ``warn_if_enabled()`` (at the end of ``import stoker``, and when a loader starts
iterating) says once per process that the GIL is on, with a ``GILEnabledWarning`` that names the
module when the note has it, and otherwise (the module was imported before stoker, or warnings
are silenced) sends the reader to ``stoker doctor``, whose check imports each candidate in a
fresh interpreter (``gil_enablers`` in ``tools/doctor_gil.py``). Nothing is said when the
interpreter has a GIL by build, or when the user turned it on themselves (``-X gil=1``,
``PYTHON_GIL=1``).

Thread contract: every function may be called from any thread; the note and the once-flag are
set under a lock.
"""

from __future__ import annotations

import re
import sys
import sysconfig
import threading
import warnings

from .errors import GILEnabledWarning

# The interpreter's own warning (Python/import.c), whose wording is the same in 3.13 and 3.14.
ENABLED_BY = re.compile(
    r"The global interpreter lock \(GIL\) has been enabled to load module '([^']+)'")


def free_threaded() -> bool:
    """This interpreter was built without the GIL (``--disable-gil``: 3.13t, 3.14t)."""
    return bool(sysconfig.get_config_var("Py_GIL_DISABLED"))


def enabled() -> bool:
    """The GIL is on now (always, on an interpreter built with one)."""
    check = getattr(sys, "_is_gil_enabled", None)
    return True if check is None else bool(check())


def chosen_by_user() -> bool:
    """The user turned the GIL on themselves: ``-X gil=1`` or ``PYTHON_GIL=1``."""
    return getattr(sys.flags, "gil", None) == 1


_lock = threading.Lock()
_enabler: str | None = None  # the module the interpreter's warning named
_warned = False
_watching = False


def note(message: str) -> str | None:
    """Keeps the module that `message` (the interpreter's warning) names; returns it."""
    global _enabler
    m = ENABLED_BY.search(message)
    if m is None:
        return None
    with _lock:
        if _enabler is None:
            _enabler = m.group(1)
    return m.group(1)


def enabler() -> str | None:
    """The module whose import turned the GIL on in this process, when it was seen."""
    return _enabler


def watch() -> None:
    """On a free-threaded interpreter whose GIL is still off: from now on the interpreter's
    warning that it turned the GIL on is noted (``note``) as it is shown. The warning still
    shows as before: ``warnings.showwarning`` is wrapped, not replaced, and the wrapper takes
    itself out once it saw the warning (the interpreter gives it once)."""
    global _watching
    if not free_threaded() or enabled():
        return
    with _lock:
        if _watching:
            return
        _watching = True
    previous = warnings.showwarning

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if isinstance(category, type) and issubclass(category, RuntimeWarning):
            if note(str(message)) is not None and warnings.showwarning is showwarning:
                warnings.showwarning = previous
        return previous(message, category, filename, lineno, file, line)

    warnings.showwarning = showwarning


def message(module: str | None) -> str:
    """What the warning says: the GIL is on, what it costs, which module, what to do."""
    version = sys.version.split()[0]
    if module is not None:
        cause = (f"importing '{module}' turned it back on (that module has not declared that "
                 "it runs without the GIL). Use a release of it built for free-threaded Python, "
                 "or keep the GIL off at your own risk with PYTHON_GIL=0 (python -X gil=0)")
    else:
        cause = ("a module imported before stoker turned it back on (the interpreter named it "
                 "in a RuntimeWarning then). `stoker doctor` names it: it imports each "
                 "candidate in a fresh interpreter. Use a free-threaded release of that module, "
                 "or keep the GIL off at your own risk with PYTHON_GIL=0 (python -X gil=0)")
    return (f"the GIL is on in this free-threaded Python {version}: {cause}. While it is on, "
            "stoker's threads (threads_per_worker, and num_workers=0 with threads) take turns "
            "on one core instead of computing side by side.")


def warn_if_enabled(stacklevel: int = 2) -> bool:
    """Once per process: a ``GILEnabledWarning`` when the GIL is on in a free-threaded
    interpreter that the user did not ask for it. True when it warned now."""
    global _warned
    if not free_threaded() or not enabled() or chosen_by_user():
        return False
    with _lock:
        if _warned:
            return False
        _warned = True
    warnings.warn(message(_enabler), GILEnabledWarning, stacklevel=stacklevel + 1)
    return True


def in_worker_start() -> bool:
    """This process is a child multiprocessing started (spawn, forkserver: a worker importing
    stoker), whose parent has had its say about the GIL."""
    process = sys.modules.get("multiprocessing.process")
    if process is None:
        return False
    # (while a spawned child unpickles its target, which imports stoker, it is "inheriting";
    # its parent is known from its bootstrap on)
    return (process.parent_process() is not None
            or getattr(process.current_process(), "_inheriting", False))


def imported() -> None:
    """``import stoker`` is done: what the GIL was then (``warn_in_worker`` compares)."""
    global _off_at_import
    _off_at_import = not enabled()


_off_at_import = False


def warn_in_worker() -> bool:
    """In a worker, once its dataset is loaded: warns (once) when the GIL, off when stoker was
    imported in this process, is on now: turned on by a module the dataset or worker_init_fn
    imported here, which the main process cannot have seen. True when it warned."""
    if not _off_at_import:
        return False
    return warn_if_enabled()
