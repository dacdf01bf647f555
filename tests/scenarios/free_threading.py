"""On a free-threaded Python (tests/test_free_threading.py): the GIL stays off after ``import
stoker`` and in its workers, whatever starts them; a module that turns it on is named, by the
warning stoker gives once and by ``stoker doctor``.

stoker is imported by each scenario, not here: one of them imports another module first."""

from __future__ import annotations

import os
import sys
import warnings


class GilInWorker:
    """Each sample: whether the GIL is on where it loads, and in which process."""

    def __init__(self, n=16):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"gil": int(sys._is_gil_enabled()), "pid": os.getpid(), "i": i}


def gil_stays_off(methods: list):
    """After `import stoker` (torch, the extension and the rest imported with it) and in every
    worker of each start method, with threads_per_worker, the GIL is off."""
    assert sys.flags.gil is None, "run without -X gil / PYTHON_GIL: the interpreter decides"
    import stoker

    assert not sys._is_gil_enabled(), "the GIL is on after import stoker"
    import torch  # (imported by stoker already: the wheel declares it runs without the GIL)

    for method in methods:
        loader = stoker.DataLoader(GilInWorker(), batch_size=4, num_workers=2,
                                   multiprocessing_context=method, threads_per_worker=2)
        got = [b for b in loader]
        gil = torch.cat([b["gil"] for b in got]).tolist()
        pids = set(torch.cat([b["pid"] for b in got]).tolist())
        assert sorted(torch.cat([b["i"] for b in got]).tolist()) == list(range(16))
        assert os.getpid() not in pids and len(pids) == 2, (method, pids)
        assert gil == [0] * 16, f"{method}: the GIL was on in a worker: {gil}"
    # num_workers=0 with threads: in this process
    assert [b["gil"].tolist() for b in stoker.DataLoader(GilInWorker(4), batch_size=2,
                                                         threads_per_worker=2)] == [[0, 0]] * 2
    assert not sys._is_gil_enabled()


def named_when_turned_on_after_import(ext_dir: str):
    """stoker is imported with the GIL off; then a module without Py_mod_gil turns it on: the
    loader's start says so once, naming that module."""
    import stoker
    from stoker.common.errors import GILEnabledWarning

    sys.path.insert(0, ext_dir)
    assert not sys._is_gil_enabled()
    warnings.simplefilter("default")
    import gilmod  # noqa: F401  (the interpreter's RuntimeWarning names it; stoker notes it)

    assert sys._is_gil_enabled()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        list(stoker.DataLoader(list(range(4)), batch_size=2))
        list(stoker.DataLoader(list(range(4)), batch_size=2))  # once
    ours = [w for w in seen if issubclass(w.category, GILEnabledWarning)]
    assert len(ours) == 1, [str(w.message) for w in seen]
    text = str(ours[0].message)
    assert "importing 'gilmod' turned it back on" in text and "PYTHON_GIL=0" in text, text


def named_by_doctor_when_turned_on_before(ext_dir: str):
    """The module was imported before stoker: import stoker says the GIL is on and sends the
    reader to stoker doctor, whose check names the module."""
    sys.path.insert(0, ext_dir)
    warnings.simplefilter("ignore")  # (the interpreter's own warning: not what is checked)
    import gilmod  # noqa: F401

    assert "stoker" not in sys.modules
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        import stoker  # noqa: F401
    from stoker.common.errors import GILEnabledWarning

    ours = [str(w.message) for w in seen if issubclass(w.category, GILEnabledWarning)]
    assert len(ours) == 1 and "stoker doctor" in ours[0], [str(w.message) for w in seen]
    from stoker.tools import doctor_gil

    found = doctor_gil.candidates()
    assert "torch" in found and "gilmod" not in found  # (not installed: added by hand)
    os.environ["PYTHONPATH"] = ext_dir + os.pathsep + os.environ.get("PYTHONPATH", "")
    check = doctor_gil.check({"gilmod": ["gilmod"], "numpy": found["numpy"]})
    assert check["status"] == "warn" and "'gilmod' (package gilmod)" in check["detail"], check
    assert "numpy" not in check["detail"].split("turns the GIL on:")[1], check


class ImportsAtInit:
    """A dataset whose worker_init_fn imports `module` in the worker."""

    def __init__(self, ext_dir):
        self.ext_dir = ext_dir

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return int(sys._is_gil_enabled())


def _import_gilmod(worker_id):
    import stoker

    info = stoker.get_worker_info()
    sys.path.insert(0, info.dataset.ext_dir)
    import gilmod  # noqa: F401


def named_in_the_worker_that_turned_it_on(ext_dir: str):
    """The module is imported in the workers only (worker_init_fn): each worker's stderr says
    that it turned the GIL on there; the main process keeps it off."""
    import stoker

    loader = stoker.DataLoader(ImportsAtInit(ext_dir), batch_size=2, num_workers=2,
                               multiprocessing_context="forkserver", worker_init_fn=_import_gilmod)
    assert sorted(x for b in loader for x in b.tolist()) == [1, 1, 1, 1]
    assert not sys._is_gil_enabled()
