"""``stoker doctor``'s check of the GIL on a free-threaded Python: which installed module turns it
back on when imported.

A module that turned the GIL on before stoker was imported cannot be named from inside that
process afterwards (the interpreter said it once, in a RuntimeWarning, before stoker listened:
``common/gil.py``). So the check asks fresh interpreters: the candidates are the installed
top-level packages that hold extension modules (compiled for this interpreter); each is imported,
then its extension modules one by one, in a fresh interpreter of its own with the GIL left to
the interpreter (``PYTHON_GIL`` unset), and the interpreter's warning names the first module
that turned the GIL on. A few interpreters at a time; a package whose imports take longer than
the time limit is reported as not judged.

A command's helper: one thread (the interpreters run beside it).
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from ..common import gil as _gil

# Imports `package`, then each module named after it, warnings recorded; prints what it saw.
PROBE = r"""
import importlib, json, re, sys, warnings
pattern = re.compile(sys.argv[1])
named, failed = None, []
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    for name in sys.argv[2:]:
        try:
            importlib.import_module(name)
        except BaseException as e:  # (a module that cannot be imported alone says why)
            failed.append([name, type(e).__name__ + ": " + str(e)[:200]])
        for w in seen:
            m = pattern.search(str(w.message))
            if m and named is None:
                named = m.group(1)
        if named is not None:
            break
on = getattr(sys, "_is_gil_enabled", lambda: True)()
print(json.dumps({"named": named, "gil": on, "failed": failed}))
"""

# extension modules per package imported at most (a package with more is judged on these)
MAX_MODULES = 200
PROBE_TIMEOUT_S = 120.0
PARALLEL = 2


def _extension_suffixes() -> tuple[str, ...]:
    # (a bare ".so" would take every shared library a wheel bundles: CUDA's, for one)
    return tuple(s for s in importlib.machinery.EXTENSION_SUFFIXES if s != ".so")


def _module_name(path: str, suffixes) -> str | None:
    """'pkg/sub/_ext.cpython-314t-x86_64-linux-gnu.so' -> 'pkg.sub._ext'."""
    path = path.replace(os.sep, "/")
    for suffix in suffixes:
        if path.endswith(suffix):
            parts = path[: -len(suffix)].split("/")
            if all(p.isidentifier() for p in parts):
                return ".".join(parts)
    return None


def candidates(distributions=None, skip=("stoker",)) -> dict[str, list[str]]:
    """Installed top-level packages (or modules) with extension modules for this interpreter:
    name -> its extension modules, in a stable order. `distributions`: what
    ``importlib.metadata.distributions()`` gives (tests pass their own)."""
    suffixes = _extension_suffixes()
    out: dict[str, set[str]] = {}
    if distributions is None:
        distributions = importlib.metadata.distributions()
    for dist in distributions:
        for f in dist.files or ():
            name = _module_name(str(f), suffixes)
            if name is None:
                continue
            top = name.split(".")[0]
            if top in skip:
                continue
            out.setdefault(top, set()).add(name)
    return {top: sorted(mods, key=lambda m: (m.count("."), m))[:MAX_MODULES]
            for top, mods in sorted(out.items())}


def probe(package: str, modules: list[str], python: str = sys.executable,
          timeout: float = PROBE_TIMEOUT_S) -> dict:
    """Imports `package` then `modules` in a fresh `python`; returns ``{"named": the module whose
    import turned the GIL on, or None, "gil": on at the end, "failed": [[module, error]],
    "error": why nothing was judged, or None}``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHON_GIL"}
    cmd = [python, "-c", PROBE, _gil.ENABLED_BY.pattern, package,
           *[m for m in modules if m != package]]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"named": None, "gil": None, "failed": [],
                "error": f"its imports took longer than {timeout:g} s"}
    lines = done.stdout.strip().splitlines()
    try:
        out = json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = done.stderr.strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
        return {"named": None, "gil": None, "failed": [],
                "error": f"the interpreter ended without a report: {tail[0][:200]}"}
    out["error"] = None
    return out


def gil_enablers(found: dict[str, list[str]], python: str = sys.executable,
                 budget_s: float = 300.0) -> dict[str, dict]:
    """`found` (``candidates()``) probed, PARALLEL at a time, within `budget_s` in all:
    package -> ``probe()``'s report (a package not started in time: ``error`` says so)."""
    deadline = time.monotonic() + budget_s
    reports: dict[str, dict] = {}

    def one(package):
        left = deadline - time.monotonic()
        if left <= 1:
            return package, {"named": None, "gil": None, "failed": [],
                             "error": "not judged: the check's time ran out"}
        return package, probe(package, found[package], python, min(PROBE_TIMEOUT_S, left))

    with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
        for package, report in pool.map(one, list(found)):
            reports[package] = report
    return reports


def _check(name, status, detail, advice=""):  # (doctor.py's shape)
    return {"check": name, "status": status, "detail": detail, "advice": advice}


def check(found: dict[str, list[str]] | None = None, python: str = sys.executable) -> dict:
    """The doctor's check: ok on an interpreter with a GIL by build; otherwise which installed
    packages turn it on (warn), or none (ok)."""
    name = "GIL (free-threaded Python)"
    if not _gil.free_threaded():
        return _check(name, "ok", "this Python has a GIL by build; threads take turns on it "
                      "(a free-threaded build, 3.13t or 3.14t, lets threads_per_worker compute "
                      "in parallel)")
    if _gil.chosen_by_user():
        return _check(name, "warn", "the GIL is on: turned on with -X gil=1 or PYTHON_GIL=1",
                      "Unset PYTHON_GIL (or drop -X gil=1) to let threads compute in parallel.")
    found = candidates() if found is None else found
    reports = gil_enablers(found, python)
    culprits = {p: r["named"] for p, r in reports.items() if r["named"]}
    unjudged = sorted(p for p, r in reports.items() if r["error"])
    detail = f"{len(reports)} installed package(s) with extension modules imported in turn"
    if unjudged:
        detail += f"; not judged: {', '.join(unjudged)}"
    if not culprits:
        return _check(name, "ok", detail + ": none turns the GIL on")
    listing = ", ".join(f"'{m}' (package {p})" for p, m in sorted(culprits.items()))
    return _check(
        name, "warn", f"{detail}; importing these turns the GIL on: {listing}",
        "They have not declared that they run without the GIL, so once one is imported "
        "threads (threads_per_worker, num_workers=0 with threads) take turns on one core. Use "
        "releases built for free-threaded Python, avoid importing them, or keep the GIL off "
        "at your own risk with PYTHON_GIL=0 (python -X gil=0).")
