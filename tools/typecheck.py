"""The type check of `make lint`: mypy over python/stoker, against a reviewed baseline that may
only shrink (tools/mypy-baseline.txt: the errors the package had when mypy joined the lint, by
file, code and message, with how many of each).

    .venv/bin/python tools/typecheck.py            # fails on any error not in the baseline
    .venv/bin/python tools/typecheck.py --update   # removes from the baseline what is fixed

It fails too when the baseline lists an error that is gone, so the file stays the truth: run
--update then (it never adds a line). New code is held to no error at all.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASELINE = os.path.join(ROOT, "tools", "mypy-baseline.txt")
_LINE = re.compile(r"^(?P<path>[^:]+):\d+: error: (?P<msg>.*?)\s+\[(?P<code>[a-z-]+)\]$")


def current() -> collections.Counter:
    r = subprocess.run([sys.executable, "-m", "mypy", "python/stoker"], cwd=ROOT,
                       capture_output=True, text=True)
    if r.returncode not in (0, 1):  # 2: mypy itself failed
        sys.exit(f"mypy failed:\n{r.stdout}{r.stderr}")
    found = collections.Counter()
    for line in r.stdout.splitlines():
        m = _LINE.match(line)
        if m:
            found[f"{m['path']}: [{m['code']}] {m['msg']}"] += 1
    return found


def baseline() -> collections.Counter:
    out = collections.Counter()
    with open(BASELINE) as f:
        for line in f:
            line = line.rstrip("\n")
            if line and not line.startswith("#"):
                count, _, key = line.partition(" ")
                out[key] = int(count)
    return out


def main() -> int:
    now, allowed = current(), baseline()
    new = now - allowed
    gone = allowed - now
    if "--update" in sys.argv[1:]:
        kept = allowed - gone
        with open(BASELINE, "w") as f:
            f.write("# mypy errors the package had when the type check joined `make lint`, "
                    "reviewed;\n# only ever shrinks (tools/typecheck.py --update).\n")
            for key in sorted(kept):
                f.write(f"{kept[key]} {key}\n")
        print(f"baseline: {sum(kept.values())} errors ({sum(gone.values())} fixed, removed)")
    elif gone:
        print("These baseline errors are fixed: run `.venv/bin/python tools/typecheck.py "
              "--update` to take them out of tools/mypy-baseline.txt:")
        for key in sorted(gone):
            print(f"  {gone[key]} {key}")
    if new:
        print("mypy errors not in the baseline (fix them; the baseline takes no new ones):")
        for key in sorted(new):
            print(f"  {new[key]} {key}")
        return 1
    if gone and "--update" not in sys.argv[1:]:
        return 1
    print(f"mypy: {sum(now.values())} errors, all in the reviewed baseline")
    return 0


if __name__ == "__main__":
    sys.exit(main())
