"""Runs torch's own test/test_dataloader.py with torch's DataLoader and with stoker's, and compares.

    python benchmarks/torch_suite/run.py --test-file PATH [--loaders torch,stoker] [--timeout 60]
                                         [-k EXPR] [--slow]

stoker does not ship torch's test file: PATH is a copy of pytorch/pytorch's
test/test_dataloader.py (the revision this runner was written against: ORIGIN_URL below; without
PATH the runner says how to get it). TORCH_TEST_FILE in the environment stands for --test-file.
The runner copies it into a folder of its own under --out and runs it there, so that nothing
beside the file where it was downloaded (a conftest.py, other modules) takes part in the run.

Each loader gets its own pytest processes (see README.md): with ``torch`` the file runs as it is;
with ``stoker``, shim/sitecustomize.py replaces torch.utils.data.DataLoader (and
torch.utils.data.dataloader.DataLoader) by stoker.DataLoader in every Python process before the
test module is imported. Every test has a time bound (shim/suite_plugin.py); when a test cannot be
interrupted and the pytest process is ended, that test is recorded as timed out and pytest starts
again on the tests not yet run.

Writes <out>/results.json and <out>/results.md: passed / failed / error / skipped per loader, and
the tests that pass with torch but not with stoker, each with its one-line error.
"""

import argparse
import datetime
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
ORIGIN_COMMIT = "74436f9025609987bbc69c617564f98635b67807"
ORIGIN = f"pytorch/pytorch test/test_dataloader.py @ {ORIGIN_COMMIT}"
ORIGIN_URL = ("https://raw.githubusercontent.com/pytorch/pytorch/"
              f"{ORIGIN_COMMIT}/test/test_dataloader.py")
# sha256 of the file at ORIGIN_COMMIT: a run of any other revision says so in its results.
ORIGIN_SHA256 = "5184d2bf8bb8a88dd27a4a9c5d6df2a41dd28f38c2230f087bcbc48f9c9cf5eb"
# The test module imports itself by its file name (self_module = __import__(...)), and the
# results name tests by it: the copy the runner runs always has torch's name.
TEST_FILE = "test_dataloader.py"
OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
SLOW_TESTS = "test_proper_exit"  # torch marks it @slowTest; it takes minutes even with torch


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--python", default=sys.executable,
                   help="interpreter with torch, pytest, expecttest and stoker (default: this one)")
    p.add_argument("--loaders", default="torch,stoker", help="comma-separated: torch, stoker")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds per test (default 120: torch's own spawn-heavy tests took over "
                        "60 s on 2 shared cores)")
    p.add_argument("--slow", action="store_true",
                   help="also run torch's @slowTest tests (test_proper_exit: minutes per loader)")
    p.add_argument("--slow-timeout", type=float, default=600.0,
                   help="seconds for a @slowTest test when --slow is given (default 600)")
    p.add_argument("--test-file", default=os.environ.get("TORCH_TEST_FILE"),
                   help="path of torch's test/test_dataloader.py (default: $TORCH_TEST_FILE); "
                        f"get it with: curl -o test_dataloader.py {ORIGIN_URL}")
    p.add_argument("-k", dest="keyword", default=None, help="pytest -k expression (a subset)")
    p.add_argument("--out", default=str(REPO / "build" / "torch_suite"), help="output folder")
    return p.parse_args(argv)


def missing_test_file(given) -> str:
    """What to tell someone who gave no test file, or one that is not there."""
    what = ("no test file given" if not given
            else f"the test file {given!r} does not exist (or is not a file)")
    return (
        f"run.py: {what}. This runner runs PyTorch's own test/test_dataloader.py, which stoker "
        "does not ship. Download the revision the runner was written against and pass its "
        "path:\n\n"
        f"    curl -o /tmp/test_dataloader.py {ORIGIN_URL}\n"
        "    python benchmarks/torch_suite/run.py --test-file /tmp/test_dataloader.py\n\n"
        "(or make torch-suite TORCH_TEST_FILE=/tmp/test_dataloader.py, or set TORCH_TEST_FILE). "
        "A newer revision of the file runs too; the results then say it is not the one at "
        f"{ORIGIN_COMMIT[:12]}.")


def stage_test_file(given, out) -> tuple[Path, dict]:
    """Copies the test file into a folder of its own under `out` (only it there: no conftest.py
    or module beside the user's copy takes part), and says which revision it is."""
    src = Path(given).expanduser().resolve()
    data = src.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    stage = out / "torch_test"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    (stage / TEST_FILE).write_bytes(data)
    known = digest == ORIGIN_SHA256
    origin = ORIGIN if known else (
        f"{src} (sha256 {digest[:16]}: not the test/test_dataloader.py of {ORIGIN_COMMIT})")
    return stage / TEST_FILE, {"origin": origin, "test_file": str(src), "sha256": digest,
                               "known_revision": known}


def run_loader(args, loader, out, stage):
    """Runs the test file (the copy in `stage`) under pytest for one loader until every collected
    test has an outcome."""
    journal = out / f"journal-{loader}.jsonl"
    journal.unlink(missing_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(HERE / "shim")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["STOKER_TORCH_SUITE_LOADER"] = loader
    env["TORCH_SUITE_JOURNAL"] = str(journal)
    env["TORCH_SUITE_TIMEOUT"] = str(args.timeout)
    env["TORCH_SUITE_SLOW_TESTS"] = SLOW_TESTS
    env["TORCH_SUITE_SLOW_TIMEOUT"] = str(args.slow_timeout if args.slow else args.timeout)
    env["PYTHONUNBUFFERED"] = "1"
    if args.slow:
        env["PYTORCH_TEST_WITH_SLOW"] = "1"
    else:
        env.pop("PYTORCH_TEST_WITH_SLOW", None)

    hard_stops = {}  # nodeid -> message, for tests during which pytest itself was ended
    log = open(out / f"pytest-{loader}.log", "w")
    started = time.monotonic()
    for attempt in range(1, 200):
        done = set(tests_with_reports(journal)) | set(hard_stops)
        # rootdir and confcutdir: the folder holding the copy (nodeids "test_dataloader.py::..."
        # and no conftest.py from any folder above it).
        cmd = [args.python, "-m", "pytest", "-c", str(HERE / "pytest.ini"),
               "--rootdir", str(stage), "--confcutdir", str(stage), "-q", "-p", "suite_plugin",
               "-p", "no:randomly", str(stage / TEST_FILE)]
        if args.keyword:
            cmd += ["-k", args.keyword]
        for nodeid in sorted(done):
            cmd += ["--deselect", nodeid]
        log.write(f"\n=== attempt {attempt}: {len(done)} tests already have an outcome ===\n")
        log.flush()
        # Its own process group, so that processes a test left behind (workers of a loader whose
        # pytest was ended, torch's ErrorTrackingProcess children) are ended with it.
        proc = subprocess.Popen(cmd, cwd=stage, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        rc = proc.wait()
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        in_flight = started_without_outcome(journal, hard_stops)
        if in_flight is None:
            if rc not in (0, 1, 5):
                log.write(f"pytest ended with exit code {rc} and no test in flight\n")
            break
        hard_stops[in_flight] = (
            f"TIMEOUT/CRASH: the pytest process ended (exit code {rc}) while this test ran; "
            f"the per-test bound is {args.timeout:g} s + 30 s for a test that cannot be interrupted")
        print(f"  [{loader}] pytest ended during {in_flight} (exit code {rc}); starting again",
              flush=True)
    log.close()
    results = outcomes_from_journal(journal, hard_stops)
    session = next((r for r in read_journal(journal) if r["event"] == "session"), {})
    return results, session, time.monotonic() - started


def read_journal(journal):
    if not journal.exists():
        return []
    records = []
    for line in journal.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short when the process was ended
            pass
    return records


def tests_with_reports(journal):
    return {r["nodeid"] for r in read_journal(journal) if r["event"] == "report"
            and r["when"] == "teardown"}


def started_without_outcome(journal, hard_stops):
    finished = tests_with_reports(journal)
    for r in read_journal(journal):
        if r["event"] == "start" and r["nodeid"] not in finished and r["nodeid"] not in hard_stops:
            return r["nodeid"]
    return None


def outcomes_from_journal(journal, hard_stops):
    """nodeid -> {"outcome", "message", "duration_s"}, pytest's way of counting a test."""
    phases = {}
    for r in read_journal(journal):
        if r["event"] == "report":
            phases.setdefault(r["nodeid"], {})[r["when"]] = r
    results = {}
    for nodeid, ph in phases.items():
        setup, call, teardown = ph.get("setup"), ph.get("call"), ph.get("teardown")
        if call is not None and call["outcome"] == "failed":
            res = ("failed", call)
        elif setup is not None and setup["outcome"] == "failed":
            res = ("error", setup)
        elif setup is not None and setup["outcome"] == "skipped":
            res = ("xfailed" if setup["wasxfail"] else "skipped", setup)
        elif call is not None and call["outcome"] == "skipped":
            res = ("xfailed" if call["wasxfail"] else "skipped", call)
        elif teardown is not None and teardown["outcome"] == "failed":
            res = ("error", teardown)
        elif call is not None:
            res = ("xpassed" if call["wasxfail"] else "passed", call)
        else:
            res = ("error", setup or teardown)
        outcome, rep = res
        duration = sum(p.get("duration_s", 0.0) for p in ph.values())
        results[nodeid] = {"outcome": outcome, "message": rep["message"] if rep else "",
                           "duration_s": round(duration, 2)}
    for nodeid, message in hard_stops.items():
        results[nodeid] = {"outcome": "failed", "message": message, "duration_s": None}
    return results


def counts(results):
    c = {k: 0 for k in OUTCOMES}
    for r in results.values():
        c[r["outcome"]] += 1
    c["timeouts"] = sum(1 for r in results.values() if "TIMEOUT" in r["message"])
    c["total"] = len(results)
    return c


def short(nodeid):
    return nodeid.split("::", 1)[-1]


def write_markdown(path, report):
    lines = [
        "# torch's test_dataloader.py: torch.utils.data.DataLoader vs stoker.DataLoader", "",
        f"- test file: {report['origin']}",
        f"- torch {report['torch_version']}, stoker at {report['stoker_commit']}, "
        f"python {report['python_version']}",
        f"- per-test bound: {report['timeout_s']:g} s; slow tests: "
        f"{'run' if report['slow'] else 'skipped (as torch does by default)'}; "
        f"subset: {report['keyword'] or 'none (whole file)'}",
        f"- date: {report['date']}", "",
        "| loader | passed | failed | error | skipped | xfailed | xpassed | timeouts | total "
        "| wall (s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, lr in report["loaders"].items():
        c = lr["counts"]
        lines.append(f"| {name} | " + " | ".join(str(c[k]) for k in OUTCOMES)
                     + f" | {c['timeouts']} | {c['total']} | {lr['wall_s']:.0f} |")
    diff = report.get("torch_pass_stoker_not")
    if diff is not None:
        lines += ["", f"## Pass with torch, not with stoker ({len(diff)})", "",
                  "| test | stoker outcome | one-line error |", "|---|---|---|"]
        for d in diff:
            msg = d["message"].replace("|", "\\|")
            lines.append(f"| {short(d['nodeid'])} | {d['outcome']} | {msg} |")
        other = report.get("stoker_pass_torch_not", [])
        if other:
            lines += ["", f"## Pass with stoker, not with torch ({len(other)})", "",
                      "| test | torch outcome | one-line error |", "|---|---|---|"]
            for d in other:
                msg = d["message"].replace("|", "\\|")
                lines.append(f"| {short(d['nodeid'])} | {d['outcome']} | {msg} |")
    path.write_text("\n".join(lines) + "\n")


def versions(python):
    code = "import sys, torch; print(torch.__version__); print(sys.version.split()[0])"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True,
                         env={k: v for k, v in os.environ.items()
                              if k != "STOKER_TORCH_SUITE_LOADER"})
    lines = out.stdout.split()
    return (lines + ["?", "?"])[:2]


def main(argv=None):
    args = parse_args(argv)
    if not args.test_file or not Path(args.test_file).expanduser().is_file():
        sys.exit(missing_test_file(args.test_file))
    loaders = [x.strip() for x in args.loaders.split(",") if x.strip()]
    for name in loaders:
        if name not in ("torch", "stoker"):
            sys.exit(f"run.py: unknown loader {name!r}; use torch and/or stoker")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    test_file, source = stage_test_file(args.test_file, out)
    if not source["known_revision"]:
        print(f"note: {source['origin']}; tests added or changed since then make the counts "
              "differ from last_run.md's", flush=True)
    torch_version, python_version = versions(args.python)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "?"
    report = {
        "origin": source["origin"], "test_file": source["test_file"],
        "test_file_sha256": source["sha256"], "torch_version": torch_version, "python_version": python_version,
        "stoker_commit": commit, "timeout_s": args.timeout, "slow": args.slow,
        "keyword": args.keyword, "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "loaders": {},
    }
    for name in loaders:
        print(f"running {args.test_file} with the {name} DataLoader ...", flush=True)
        results, session, wall = run_loader(args, name, out, test_file.parent)
        expected = "stoker." if name == "stoker" else "torch."
        seen = (session.get("module_DataLoader") or session.get("torch_utils_data_DataLoader")
                or "")
        if not seen.startswith(expected):
            sys.exit(f"run.py: the {name} run's test module used DataLoader {seen!r}, expected "
                     f"{expected}...; see {out}/pytest-{name}.log")
        report["loaders"][name] = {"counts": counts(results), "wall_s": round(wall, 1),
                                   "session": session, "tests": results}
        c = report["loaders"][name]["counts"]
        print(f"  {name}: " + ", ".join(f"{c[k]} {k}" for k in OUTCOMES)
              + f" ({c['timeouts']} timeouts) in {wall:.0f} s", flush=True)
    if "torch" in report["loaders"] and "stoker" in report["loaders"]:
        t = report["loaders"]["torch"]["tests"]
        s = report["loaders"]["stoker"]["tests"]
        report["torch_pass_stoker_not"] = [
            {"nodeid": n, **s[n]} for n in sorted(t)
            if t[n]["outcome"] == "passed" and n in s and s[n]["outcome"] != "passed"]
        report["stoker_pass_torch_not"] = [
            {"nodeid": n, **t[n]} for n in sorted(s)
            if s[n]["outcome"] == "passed" and n in t and t[n]["outcome"] != "passed"]
    (out / "results.json").write_text(json.dumps(report, indent=1) + "\n")
    write_markdown(out / "results.md", report)
    print(f"wrote {out / 'results.json'} and {out / 'results.md'}")


if __name__ == "__main__":
    main()
