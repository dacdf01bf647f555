"""``stoker bench --threads``: threads that compute, on the interpreter that runs the bench.

For each workload (``decode``: JPEGs decoded with Pillow, which releases the GIL for the decode
itself; ``compute``: a few ms of pure Python a sample, which only a free-threaded interpreter
runs on two threads at once), these settings, each a fresh interpreter, alternated round after
round (the medians count, every ratio is taken within a round):

- stoker, 1 worker process, ``threads_per_worker`` 1, 2 and "auto";
- stoker, ``num_workers=0`` and 2 threads (no worker process at all);
- torch, ``num_workers`` 1 and 2.

It prints samples/s, total PSS (the process and its workers), how many samples a worker loaded
at once mid-run ("auto"'s width), whether the GIL was on, and the three ratios the free-threaded
targets are stated in (docs/performance.md): 1 worker x 2 threads against 1 x 1, no worker with
2 threads against torch's 2 workers (and their PSS), "auto" against the best fixed thread count.
"""

from __future__ import annotations

import statistics
import sys
from typing import Any

from . import harness

# (label, loader, num_workers, threads_per_worker)
SETTINGS = (
    ("stoker 1w x1", "stoker", 1, 1),
    ("stoker 1w x2", "stoker", 1, 2),
    ("stoker 1w auto", "stoker", 1, "auto"),
    ("stoker 0w x2", "stoker", 0, 2),
    ("torch 1w", "torch", 1, None),
    ("torch 2w", "torch", 2, None),
)
WORKLOADS = ("decode", "compute")


def measure(workloads=WORKLOADS, rounds: int = 3, progress=print) -> dict:
    """Every setting of `SETTINGS` on each workload, `rounds` times; returns the runs and the
    summary (``summarize``)."""
    runs = []
    for r in range(rounds):
        for wl in workloads:
            for label, who, workers, threads in SETTINGS:
                res = harness.run(who, wl, workers, threads=threads)
                res.update(label=label, round=r)
                runs.append(res)
                if progress:
                    got = (f"{res['samples_per_s']:.0f}/s" if "error" not in res
                           else res["error"])
                    progress(f"round {r + 1}/{rounds} {wl:8} {label:15} {got}")
    return {"runs": runs, "summary": summarize(runs, workloads)}


def _ratio(runs, wl, top, bottom):
    """The median over rounds of `top`'s samples/s over `bottom`'s, in the same round."""
    by = {}
    for r in runs:
        if r["workload"] == wl and "error" not in r:
            by.setdefault(r["round"], {})[r["label"]] = r
    out = [rows[top]["samples_per_s"] / rows[bottom]["samples_per_s"]
           for rows in by.values() if top in rows and bottom in rows
           and rows[bottom]["samples_per_s"] > 0]
    return statistics.median(out) if out else None


def _median(rows, key):
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def summarize(runs, workloads) -> dict:
    out: dict = {"gil_enabled": getattr(sys, "_is_gil_enabled", lambda: True)(),
                 "python": sys.version.split()[0], "workloads": {}}
    for wl in workloads:
        rows: dict[str, dict[str, Any]] = {}
        for label, *_ in SETTINGS:
            mine = [r for r in runs if r["workload"] == wl and r["label"] == label]
            ok = [r for r in mine if "error" not in r]
            if not ok:
                rows[label] = {"error": mine[0]["error"] if mine else "not run"}
                continue
            rows[label] = {"samples_per_s": _median(ok, "samples_per_s"),
                           "pss_total_mb": _median(ok, "pss_total_mb"),
                           "at_once": _median(ok, "at_once"),
                           "gil_enabled": any(r.get("gil_enabled") for r in ok)}
        fixed = [lbl for lbl in ("stoker 1w x1", "stoker 1w x2")
                 if "samples_per_s" in rows.get(lbl, {})]
        best = max(fixed, key=lambda lbl: rows[lbl]["samples_per_s"]) if fixed else None
        pss0 = rows.get("stoker 0w x2", {}).get("pss_total_mb")
        pss_torch = rows.get("torch 2w", {}).get("pss_total_mb")
        out["workloads"][wl] = {
            "rows": rows,
            "two_threads_vs_one": _ratio(runs, wl, "stoker 1w x2", "stoker 1w x1"),
            "no_worker_two_threads_vs_torch_2w": _ratio(runs, wl, "stoker 0w x2", "torch 2w"),
            "no_worker_pss_vs_torch_2w": (pss0 / pss_torch if pss0 and pss_torch else None),
            "auto_vs_best_fixed": (_ratio(runs, wl, "stoker 1w auto", best) if best else None),
            "best_fixed": best,
        }
    return out


def _f(v, spec):
    return "-" if v is None else format(v, spec)


def print_summary(summary, out=sys.stdout) -> None:
    print(f"Python {summary['python']}, GIL {'on' if summary['gil_enabled'] else 'off'}",
          file=out)
    for wl, s in summary["workloads"].items():
        print(f"\n{wl}: {'setting':15} {'samples/s':>10} {'PSS MB':>8} {'at once':>8} GIL",
              file=out)
        for label, row in s["rows"].items():
            if "error" in row:
                print(f"{'':{len(wl) + 2}}{label:15} error: {row['error']}", file=out)
                continue
            print(f"{'':{len(wl) + 2}}{label:15} {_f(row['samples_per_s'], '10.0f')} "
                  f"{_f(row['pss_total_mb'], '8.0f')} {_f(row['at_once'], '8.0f')} "
                  f"{'on' if row['gil_enabled'] else 'off'}", file=out)
        print(f"  1 worker x 2 threads / x 1:            {_f(s['two_threads_vs_one'], '.2f')}x",
              file=out)
        print(f"  no worker, 2 threads / torch 2 workers: "
              f"{_f(s['no_worker_two_threads_vs_torch_2w'], '.2f')}x at "
              f"{_f(s['no_worker_pss_vs_torch_2w'], '.2f')}x the PSS", file=out)
        print(f"  \"auto\" / best fixed ({s['best_fixed']}):  "
              f"{_f(s['auto_vs_best_fixed'], '.2f')}x", file=out)


def main(workloads=WORKLOADS, rounds: int = 3) -> dict:
    result = measure(workloads, rounds, progress=lambda line: print(line, file=sys.stderr))
    print_summary(result["summary"])
    return result
