"""``stoker bench --autotune``: num_workers="auto" against the best fixed num_workers.

The scenario where the right count is not obvious: workers decode JPEGs (random crop and flip)
and the training step itself takes a core (a busy loop in the main process, as a CPU-side
step or a host-side launch loop would). Every fixed count from 1 to the usable CPUs is run, then
"auto"; each run is a fresh interpreter. Throughput is taken over the second half of a run (the
steady state); for "auto", the table also says after how many batches a sliding window of
``WINDOW`` batches first reached 95% of the best fixed count's throughput.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

WINDOW = 16  # batches in the sliding throughput window
BATCH = 16


def _dataset(n):
    from .workloads import JpegDecode

    return JpegDecode(n)


def calibrate_step_s(cpus: int) -> float:
    """A training step about as long as loading a batch takes (cpus - 1) / 1.5 workers: the
    best count is neither 1 nor all CPUs when there are a few."""
    ds = _dataset(BATCH * 4)
    t = time.perf_counter()
    for i in range(BATCH * 4):
        ds[i]
    per_batch = (time.perf_counter() - t) / 4
    return per_batch / max(1.0, (cpus - 1) / 1.5)


def run_in_process(num_workers, batches: int, step_s: float) -> dict:
    import stoker

    dl = stoker.DataLoader(_dataset(BATCH * batches), batch_size=BATCH, num_workers=num_workers)
    stamps = []
    for _ in dl:
        end = time.perf_counter() + step_s
        while time.perf_counter() < end:  # the training step: one core, busy
            pass
        stamps.append(time.perf_counter())
    half = len(stamps) // 2
    steady = (len(stamps) - half - 1) * BATCH / (stamps[-1] - stamps[half])
    out = {"num_workers": num_workers, "samples_per_s": steady, "stamps": stamps,
           "workers": dl.num_workers}
    auto = dl.stats().get("autotune")
    if auto:
        out["active_workers"] = auto["active_workers"]
        out["decisions"] = auto["decisions"]
    return out


def _run(num_workers, batches, step_s, timeout=300) -> dict:
    code = ("import json; from stoker.bench.autotune import run_in_process; print('RESULT', "
            f"json.dumps(run_in_process({num_workers!r}, {batches}, {step_s!r})))")
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=timeout, env=env)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"num_workers={num_workers!r}: {p.stderr.strip()[-2000:]}")


def batches_to_reach(stamps, target_samples_per_s) -> int | None:
    """The first batch at which the last WINDOW batches ran at `target` or faster."""
    for i in range(WINDOW, len(stamps)):
        rate = WINDOW * BATCH / (stamps[i] - stamps[i - WINDOW])
        if rate >= target_samples_per_s:
            return i + 1
    return None


def main(batches: int = 160, out=sys.stdout) -> dict:
    from .._cgroup import usable_cpus

    cpus = usable_cpus()
    step_s = calibrate_step_s(cpus)
    print(f"autotune scenario: JPEG decode in workers ({BATCH} per batch), a training step of "
          f"{1e3 * step_s:.1f} ms busy on one core; {cpus} usable CPUs; {batches} batches a run",
          file=out)
    fixed = [_run(k, batches, step_s) for k in range(1, cpus + 1)]
    auto = _run("auto", batches, step_s)
    best = max(fixed, key=lambda r: r["samples_per_s"])
    reached = batches_to_reach(auto["stamps"], 0.95 * best["samples_per_s"])
    print(f"{'num_workers':>12} {'samples/s':>10} {'of best':>8}", file=out)
    for r in fixed + [auto]:
        name = str(r["num_workers"])
        if r is auto:
            name += f" (->{r.get('active_workers')})"
        print(f"{name:>12} {r['samples_per_s']:10.0f} "
              f"{100 * r['samples_per_s'] / best['samples_per_s']:7.0f}%", file=out)
    changes = [(d["batch"], d["active"]) for d in auto.get("decisions", [])]
    print(f"auto: {100 * auto['samples_per_s'] / best['samples_per_s']:.0f}% of the best fixed "
          f"count ({best['num_workers']}); a {WINDOW}-batch window first reached 95% of it at "
          f"batch {reached if reached is not None else 'never'}; (batch, active workers): "
          f"{changes}", file=out)
    return {"fixed": fixed, "auto": auto, "best": best["num_workers"], "reached_at": reached,
            "step_s": step_s}
