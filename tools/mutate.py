"""Mutation testing of stoker's pure parts (`make mutate`; docs/mutation.md): mutmut 3 over the
modules below, against the fast tier of tests (unit tests: no process, no worker, no loader
iterated with workers).

    .venv/bin/python tools/mutate.py                 # stage, check the imports, run, report
    .venv/bin/python tools/mutate.py --report-only   # the report of the last run again
    .venv/bin/python tools/mutate.py --survivors     # and the diff of every surviving mutant
    .venv/bin/python tools/mutate.py --rev HEAD      # a commit's package and tests, not the
        working tree's (what others have half-edited stays out; the extension is the installed)
    .venv/bin/python tools/mutate.py --stage-only    # stage only: then the fast tier runs
        against the source tree with PYTHONPATH=build/mutate/src .venv/bin/python -m pytest ...

The trap it avoids: the tests import the *installed* stoker (site-packages), never the source
tree, so a tool that mutates python/stoker in place would see every mutant survive. Here the
package is staged in build/mutate/src/stoker (a copy of python/stoker with the installed
extension, ``_stoker*.so``, beside it) and the tests in build/mutate/tests; mutmut copies both
into build/mutate/mutants/ and puts mutants/src first on ``sys.path``, so ``import stoker`` is the
mutated copy. Before the run, a pre-flight check proves it: ``stoker.__file__`` must be in the
staged tree, and a deliberately broken staged module must make its tests fail. The source tree
is never written to.

Not in CI: about eleven minutes on two cores (2,559 mutants).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAGE = os.path.join(ROOT, "build", "mutate")

# The modules mutated (paths under python/stoker).
MODULES = [
    "worker/inflight.py",
    "worker/gate.py",
    "worker/fetch.py",
    "config/load.py",
    "loader/resume/cursor.py",
    "loader/resume/position.py",
    "loader/resume/order.py",
    "loader/resume/validate.py",
    "loader/resume/layout.py",
    "loader/resume/rebatch.py",
    "placements/node/ledger.py",
    "placements/node/budget.py",
    "placements/node/streams.py",
    "placements/node/records.py",
    "placements/node/wire.py",
    "placements/node/group.py",
    "wire/protocol.py",
    "common/advice.py",
]

# The fast tier: the suite's unit tier (tests/support/tiers.py: no process is started, each test
# runs in milliseconds to a second; `make test-quick`). mutmut runs, for each mutant, only those
# of its tests that call the mutated function.
# The layers test's line count is left out: mutmut's copy of a module holds every mutant of it;
# so is develop.md's links test (it links into benchmarks/, which is not staged).
FAST_TESTS = ["-m", "unit", "tests",
              "--deselect", "tests/test_layers.py::test_no_module_is_over_450_lines",
              "--deselect",
              "tests/test_docs_run.py::test_every_relative_link_leads_to_a_file[docs/develop.md]"]

# What the unit tier reads beside the tests (the README's option table, the docs).
ALSO_STAGED = ["README.md", "docs"]

# A module broken on purpose by the pre-flight check, and a test of it that must then fail.
TRAP_MODULE = "common/advice.py"
TRAP_TEST = "tests/common/test_advice_mutants.py"

# timeout_*: a mutant's tests get (their clean run's time + 2 s) x 4 of wall clock, then it is
# killed and counted a timeout (detected): a gate whose threads never serve hangs its test.
SETUP_CFG = """\
# Written by tools/mutate.py: edit it there.
[mutmut]
source_paths = src
also_copy =
{also}
only_mutate =
{only}
pytest_add_cli_args_test_selection =
{tests}
pytest_add_cli_args =
    -p
    no:cacheprovider
    -W
    ignore
process_isolation = fork
timeout_multiplier = 4.0
timeout_constant = 2.0
use_git_change_detection = false

[tool:pytest]
addopts = -p no:cacheprovider
"""


def _installed_extension() -> str:
    """The built extension of the installed stoker (only the installed copy has it)."""
    site = sysconfig.get_paths()["purelib"]
    found = glob.glob(os.path.join(site, "stoker", "_stoker*.so"))
    if not found:
        sys.exit("tools/mutate.py: no installed stoker/_stoker*.so in "
                 f"{site}: run `make install` first")
    return found[0]


def _ignore(_dir, names):
    return [n for n in names if n in ("__pycache__", ".pytest_cache") or n.endswith(".pyc")]


def stage(modules, rev: str | None = None) -> None:
    """build/mutate: src/stoker (the source and the installed extension), tests/, setup.cfg;
    from the working tree, or from commit `rev` (what others have half-edited stays out)."""
    shutil.rmtree(STAGE, ignore_errors=True)
    os.makedirs(STAGE)
    root = ROOT
    if rev is not None:
        root = os.path.join(STAGE, "rev")
        os.makedirs(root)
        archive = subprocess.run(["git", "archive", rev, "python/stoker", "tests",
                                  *ALSO_STAGED], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", root], input=archive.stdout, check=True)
    src = os.path.join(STAGE, "src", "stoker")
    shutil.copytree(os.path.join(root, "python", "stoker"), src, ignore=_ignore)
    shutil.copy2(_installed_extension(), src)
    shutil.copytree(os.path.join(root, "tests"), os.path.join(STAGE, "tests"), ignore=_ignore)
    for name in ALSO_STAGED:
        path = os.path.join(root, name)
        if os.path.isdir(path):
            shutil.copytree(path, os.path.join(STAGE, name), ignore=_ignore)
        else:
            shutil.copy2(path, STAGE)
    if rev is not None:
        shutil.rmtree(root)
    commit = subprocess.run(["git", "rev-parse", "--short=12", rev or "HEAD"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(STAGE, "staged.json"), "w") as f:
        json.dump({"commit": commit, "working_tree": rev is None,
                   "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, f)
    indent = "    "
    with open(os.path.join(STAGE, "setup.cfg"), "w") as f:
        f.write(SETUP_CFG.format(
            only="\n".join(indent + "src/stoker/" + m for m in modules),
            also="\n".join(indent + a for a in ALSO_STAGED),
            tests="\n".join(indent + t for t in FAST_TESTS)))


def _pytest(args, pythonpath, cwd):
    env = dict(os.environ, PYTHONPATH=pythonpath, PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                           "--rootdir", cwd, *args], cwd=cwd, env=env, capture_output=True,
                          text=True)


def preflight() -> None:
    """The staged package is the one the tests import, and breaking it fails them."""
    src = os.path.join(STAGE, "src")
    env = dict(os.environ, PYTHONPATH=src, PYTHONDONTWRITEBYTECODE="1")
    where = subprocess.run([sys.executable, "-c", "import stoker, stoker._stoker as e; "
                            "print(stoker.__file__); print(e.__file__)"],
                           cwd=STAGE, env=env, capture_output=True, text=True, check=True)
    for line in where.stdout.split():
        if not os.path.realpath(line).startswith(os.path.realpath(src) + os.sep):
            sys.exit(f"tools/mutate.py: the tests would import {line}, not the staged copy")
    clean = _pytest([TRAP_TEST], src, STAGE)  # (it is of the unit tier)
    if clean.returncode != 0:
        sys.exit(f"tools/mutate.py: {TRAP_TEST} fails on the unmutated copy:\n{clean.stdout}")
    path = os.path.join(src, "stoker", TRAP_MODULE)
    with open(path) as f:
        good = f.read()
    try:
        with open(path, "w") as f:  # every function of the module now answers wrongly
            f.write(good + "\n\ndef waiting(cpu_s, busy_s):\n    return None\n")
        broken = _pytest([TRAP_TEST], src, STAGE)
    finally:
        with open(path, "w") as f:
            f.write(good)
    if broken.returncode == 0:
        sys.exit("tools/mutate.py: a broken staged module did not fail its tests: they do not "
                 "import the staged copy")
    print(f"pre-flight: stoker imports from {os.path.dirname(where.stdout.split()[0])}; a "
          f"broken {TRAP_MODULE} fails {TRAP_TEST}", flush=True)


def run_mutmut(max_children: int) -> int:
    mutmut = os.path.join(os.path.dirname(sys.executable), "mutmut")
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONPATH", None)
    log = os.path.join(STAGE, "mutmut.log")
    print(f"mutmut run (its output in {os.path.relpath(log, ROOT)})", flush=True)
    with open(log, "w") as f:
        rc = subprocess.run([mutmut, "run", "--max-children", str(max_children)], cwd=STAGE,
                            env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    with open(log, errors="replace") as f:
        tail = f.read()[-4000:].replace("\r", "\n").splitlines()
    # (its progress spinner rewrites one line: the last few lines say how it ended)
    print("\n".join(line for line in tail[-6:] if line.strip()), flush=True)
    return rc


_STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests",
           34: "skipped", 36: "timeout", -24: "timeout", 24: "timeout", 152: "timeout",
           255: "timeout", 37: "type check", None: "not checked"}


def results(modules) -> dict:
    """{module: {status: [mutant names]}} from mutmut's meta files."""
    out = {}
    for m in modules:
        meta = os.path.join(STAGE, "mutants", "src", "stoker", m + ".meta")
        by = {}
        if os.path.exists(meta):
            with open(meta) as f:
                codes = json.load(f).get("exit_code_by_key", {})
            for name, code in codes.items():
                by.setdefault(_STATUS.get(code, "suspicious"), []).append(name)
        out[m] = by
    return out


def staged() -> str:
    try:
        with open(os.path.join(STAGE, "staged.json")) as f:
            d = json.load(f)
    except OSError:
        return ""
    what = "the working tree at" if d["working_tree"] else "commit"
    return f"{d['date']}, {what} {d['commit']}\n\n"


def table(res) -> str:
    rows = ["| module | mutants | killed | timeout | survived | no tests | score |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    tk = tt = 0
    for m, by in res.items():
        n = sum(len(v) for v in by.values())
        k, to = len(by.get("killed", ())), len(by.get("timeout", ()))
        s, nt = len(by.get("survived", ())), len(by.get("no tests", ()))
        tk, tt = tk + k + to, tt + n
        score = f"{100 * (k + to) / n:.1f}%" if n else "-"
        rows.append(f"| {m} | {n} | {k} | {to} | {s} | {nt} | {score} |")
    rows.append(f"| all | {tt} | | | | | {100 * tk / tt:.1f}% |" if tt else "| all | 0 | | | | | - |")
    return "\n".join(rows)


_DIFFS = """
import json, sys
from mutmut.mutation.diff_apply import get_diff_for_mutant
for name, path in json.load(sys.stdin):
    lines = get_diff_for_mutant(name, path=path).splitlines()
    print("\\n".join(x for x in lines[2:] if x[:1] in "+-" and x[1:].strip()) + "\\n")
"""


def survivors(res, diffs: bool) -> str:
    """Each mutant not killed, with its changed lines when `diffs`."""
    todo = [(status, name, "src/stoker/" + m) for m, by in res.items()
            for status in ("survived", "no tests", "suspicious", "not checked")
            for name in sorted(by.get(status, ()))]
    shown = [""] * len(todo)
    if diffs and todo:
        r = subprocess.run([sys.executable, "-c", _DIFFS], cwd=STAGE, text=True,
                           capture_output=True,
                           input=json.dumps([(name, path) for _, name, path in todo]))
        got = r.stdout.split("\n\n")
        shown = [("\n" + got[i].strip()) if i < len(got) else "" for i in range(len(todo))]
    return "\n".join(f"{status}: {name}{diff}" for (status, name, _), diff in zip(todo, shown))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--report-only", action="store_true", help="report the last run")
    ap.add_argument("--stage-only", action="store_true",
                    help="stage the package and check the imports, nothing more (then "
                         "PYTHONPATH=build/mutate/src runs tests against the source tree)")
    ap.add_argument("--survivors", action="store_true", help="print each survivor's diff")
    ap.add_argument("--rev", help="stage this commit (HEAD, say) rather than the working tree")
    ap.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--modules", nargs="*", help="a subset of the modules (paths under stoker/)")
    args = ap.parse_args()
    modules = args.modules or MODULES
    unknown = [m for m in modules if m not in MODULES]
    if unknown:
        sys.exit(f"tools/mutate.py: not a module of the mutation run: {unknown}")
    t0 = time.monotonic()
    if not args.report_only:
        stage(modules, args.rev)
        preflight()
        if args.stage_only:
            return 0
        rc = run_mutmut(args.max_children)
        if rc != 0:
            print(f"tools/mutate.py: mutmut exited with {rc}", file=sys.stderr)
            return rc
    res = results(modules)
    text = staged() + table(res)
    rest = survivors(res, args.survivors)
    with open(os.path.join(STAGE, "report.md"), "w") as f:
        f.write(text + "\n\n" + rest + "\n")
    with open(os.path.join(STAGE, "report.json"), "w") as f:
        json.dump(res, f, indent=1, sort_keys=True)
    print(text)
    if rest:
        print("\n" + rest)
    if not args.report_only:
        print(f"\nmutation run: {time.monotonic() - t0:.0f} s; report in build/mutate/report.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
