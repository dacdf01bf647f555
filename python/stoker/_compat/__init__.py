"""Old names kept for what earlier releases pickled or imported: a loader pickled by stoker 0.1
or 0.2 still loads, and a module path of 0.2 still imports (``moved.py``).

stoker 0.1 was one flat package, and a loader it pickled (``pickle``, ``copy``, ``torch.save``)
names classes in four modules that are gone: ``stoker._state``, ``stoker._checkpoint``,
``stoker._fetch`` and ``stoker._deaths`` (``OLD_NAMES`` says which class of each). Unpickling
finds a class by importing its module and reading the attribute, so ``register()``, which
``import stoker`` calls, enters each old module name in ``sys.modules`` as an alias of ``v0_1``,
the one module that holds all those classes now. No file of the package carries an old name,
and ``pickle.load``, ``torch.load`` and ``copy.deepcopy`` need nothing else: a pickle that names
an old module imports ``stoker`` first, which registers the aliases before the lookup.

A state from ``state_dict()`` names no class at all (plain data, ``torch.load(weights_only=True)``
loads it); ``loader/resume/state.py`` reads the 0.1 form of it.

Thread contract: ``register`` runs while ``stoker`` is imported (under the import lock).
"""

from __future__ import annotations

import sys

from . import moved, v0_1

# stoker 0.1's modules, and the classes its pickles name in each (all of them in v0_1 now).
OLD_NAMES = {
    "stoker._state": ("LoaderState",),
    "stoker._checkpoint": ("Tracker", "EpochRecord"),
    "stoker._fetch": ("SkippedSample",),
    "stoker._deaths": ("Death",),
}


def register() -> None:
    """Makes each of stoker 0.1's module names an alias of ``v0_1`` (an entry already there is
    left alone), and stoker 0.2's module paths lead to where each module is now."""
    for name in OLD_NAMES:
        sys.modules.setdefault(name, v0_1)
    moved.install()
