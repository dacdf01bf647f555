"""The same failures, fed to torch's DataLoader and to stoker's, side by side.

Each scenario runs in its own process with a hard time limit (torch can hang), once per loader,
and the table says what the user sees: the exception and the first line of its message, or that
the run completed, or that it hung. Run: ``.venv/bin/python benchmarks/faults_vs_torch.py``
(``--markdown`` prints the table in docs/guide/failures.md).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import textwrap
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")
LIMIT_S = 40

PRELUDE = """
import os, signal, sys, tempfile, time, torch, stoker
from torch.utils.data import DataLoader as TorchLoader
from scenario_datasets import *
L = stoker.DataLoader if LOADER == "stoker" else TorchLoader
def run(ds, **kw):
    t = time.monotonic()
    try:
        n = sum(len(b[1]) if isinstance(b, (list, tuple)) else len(b) for b in L(ds, **kw))
        print(f"RESULT completed: {n} samples in {time.monotonic() - t:.1f} s")
    except BaseException as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(f"RESULT {type(e).__name__}: {first[:150]} ({time.monotonic() - t:.1f} s)")
"""

SCENARIOS = [
    ("worker SIGKILLed twice mid-epoch (64 samples)", """
run(KillsOnceAt([10, 40], tempfile.mkdtemp()), batch_size=4, num_workers=2)
"""),
    ("segfault in a decoder at index 21", """
run(KillsSelfAt(21, signal.SIGSEGV), batch_size=4, num_workers=2)
"""),
    ("segfault at index 21, on_error='skip' (stoker only)", """
kw = {"on_error": "skip"} if LOADER == "stoker" else {}
run(KillsSelfAt(21, signal.SIGSEGV), batch_size=4, num_workers=2, **kw)
"""),
    ("worker exits (sys.exit(3)) at index 5", """
run(ExitsAt(5, code=3), batch_size=2, num_workers=2)
"""),
    ("sample 9 hangs forever, timeout=5", """
run(HangsAt(9), batch_size=2, num_workers=2, timeout=5)
"""),
    ("exception in __getitem__ at index 13", """
run(RaisesAt(13), batch_size=4, num_workers=2)
"""),
    ("samples of different shapes", """
run(RaggedAt(6), batch_size=4, num_workers=2)
"""),
    ("unpicklable object in the batch", """
run(Squares(), batch_size=4, num_workers=2, collate_fn=collate_with_lock)
"""),
    ("ulimit -n 128, user holds 100 batches", """
import resource
resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))
held = []
t = time.monotonic()
try:
    for b in L(Squares(400, shape=(1024,)), batch_size=4, num_workers=4):
        held.append(b)
    print(f"RESULT completed: {4 * len(held)} samples in {time.monotonic() - t:.1f} s")
except BaseException as e:
    print(f"RESULT {type(e).__name__}: {str(e).strip().splitlines()[0][:150]}")
"""),
]

TINY_SHM = ("64 MB batches through a 16 MB /dev/shm", """
run(Big(n=4, mb=64), batch_size=1, num_workers=2)
""")

OOM = ("a sample needs 2 GiB in a 900 MiB memory cgroup", """
run(Hog(5, mb=2048, n=16), batch_size=2, num_workers=2)
""")


def run_one(loader: str, code: str, wrapper=None) -> str:
    src = f"LOADER = {loader!r}\n" + PRELUDE + textwrap.dedent(code)
    cmd = [sys.executable, "-c", src]
    if wrapper:
        cmd = wrapper + cmd
    env = dict(os.environ, PYTHONPATH=TESTS + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env["PYTHONWARNINGS"] = "ignore"
    t = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=TESTS, env=env, capture_output=True, text=True,
                           timeout=LIMIT_S, start_new_session=True)
    except subprocess.TimeoutExpired:
        return f"hangs: no batch, no error, killed after {LIMIT_S} s"
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return line[len("RESULT "):]
    tail = (p.stderr.strip().splitlines() or ["(nothing)"])[-1]
    return f"process died (exit {p.returncode}, {time.monotonic() - t:.1f} s): {tail[:120]}"


def _tiny_shm_wrapper():
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return None
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        return None
    return ["unshare", "-m", "sh", "-c",
            'mount -t tmpfs -o size=16m tmpfs /dev/shm && exec "$@"', "sh"]


def _oom_cgroup():
    sys.path.insert(0, TESTS)
    from faults.test_oom import _make_memory_cgroup

    d, _ = _make_memory_cgroup(900 * 2**20)
    return d


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = ap.parse_args()
    rows = []
    scenarios = [(name, code, None) for name, code in SCENARIOS]
    shm = _tiny_shm_wrapper()
    if shm:
        scenarios.append((TINY_SHM[0], TINY_SHM[1], shm))
    cg = _oom_cgroup()
    if cg:
        scenarios.append((OOM[0], OOM[1],
                          ["sh", "-c", f'echo $$ > {cg}/cgroup.procs && exec "$@"', "sh"]))
    try:
        for name, code, wrapper in scenarios:
            torch_out = run_one("torch", code, wrapper)
            stoker_out = run_one("stoker", code, wrapper)
            rows.append((name, torch_out, stoker_out))
            if not args.markdown:
                print(f"{name}\n  torch : {torch_out}\n  stoker: {stoker_out}", flush=True)
    finally:
        if cg:
            try:
                os.rmdir(cg)
            except OSError:
                pass
    if args.markdown:
        print("| scenario | torch DataLoader | stoker.DataLoader |")
        print("|---|---|---|")
        for name, a, b in rows:
            print(f"| {name} | {a.replace('|', '/')} | {b.replace('|', '/')} |")


if __name__ == "__main__":
    sys.exit(main())
