"""stoker's by-value rules (``stoker/pickling/by_value.py`` and ``main_script.py``, copied
beside this file by the test, as a package ``rules``) on another Python, without stoker or torch:
a local class, a lambda, a closure, a partial and a class defined under this script's main guard, sent to forkserver and spawn children as stoker
sends its workers' dataset, collate_fn and worker_init_fn. Prints one JSON line.

Run as ``pythonX.Y by_value_standalone.py`` (tests/pickling/test_by_value.py does, for each
Python 3.12 or later it finds): it checks what depends on the interpreter's version (code objects, a class's
``__firstlineno__`` from 3.13, the start methods' rules), not stoker's transport.
"""

import functools
import json
import multiprocessing
import pickle
import sys

from rules import by_value as _by_value


def load_and_run(data: bytes) -> list:
    dataset, collate_fn, init_fn = pickle.loads(data)
    init_fn(0)
    return collate_fn([dataset[i] for i in range(4)])


def local_parts():
    class Local:
        def __getitem__(self, i):
            return i * i

    k = 10

    def init(worker_id, scale=1):
        assert worker_id == 0 and scale == 2

    return Local(), (lambda batch: [x + k for x in batch]), functools.partial(init, scale=2)


def main(guarded: type) -> None:
    out = {"python": sys.version.split()[0],
           "needed": [_by_value.needed(x) for x in (guarded, load_and_run, local_parts)]}
    for method in ("forkserver", "spawn"):
        with multiprocessing.get_context(method).Pool(1) as pool:
            for name, parts in (("local", local_parts()),
                                ("guarded", (guarded(), list, abs))):
                try:
                    pickle.dumps(parts)
                    plain = "pickles"
                except Exception as e:  # what plain pickle says
                    plain = type(e).__name__
                out[f"{method}/{name}"] = [plain, pool.apply(load_and_run,
                                                             (_by_value.dumps(parts),))]
    print(json.dumps(out))


if __name__ == "__main__":
    class Guarded:  # a child runs this file as __mp_main__, skipping this block: by value
        def __getitem__(self, i):
            return -i

    main(Guarded)
