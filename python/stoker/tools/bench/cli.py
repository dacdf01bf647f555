"""``stoker bench``: every workload, stoker against torch's DataLoader (and installed peers),
alternating the loaders round after round; every figure is a median, every ratio is taken
between runs of the same round. Each round also times the work itself with no loader
(``bound.py``): "bound/s" is the most any loader could deliver on this machine, "of bound" each
loader's share of it."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from . import harness, peers
from .workloads import DEFAULT, WORKLOADS


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def _median(rows, key):
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def bench(workloads, loaders, workers, rounds, progress=True, start_method=None):
    runs = []
    total = len(workloads) * (len(loaders) + 1) * rounds
    bar = None
    if progress:
        try:
            from tqdm import tqdm

            bar = tqdm(total=total, desc="stoker bench", unit="run", file=sys.stderr)
        except ImportError:
            bar = None
    for r in range(rounds):
        for wl in workloads:
            res = harness.bound(wl)  # what the work itself allows, in this round
            res["round"] = r
            runs.append(res)
            if bar:
                bar.set_postfix_str(f"{wl}/bound")
                bar.update(1)
            for who in loaders:  # A B A B: the same order every round
                if WORKLOADS[wl].measure_memory and who != "torchdata":
                    res = harness.run_with_memory_baseline(who, wl, workers)
                else:
                    res = harness.run(who, wl, workers, start_method=start_method)
                res["round"] = r
                runs.append(res)
                if bar:
                    bar.set_postfix_str(f"{wl}/{who}")
                    bar.update(1)
    if bar:
        bar.close()
    return runs


# A row faster than this share of the work's own bound (timed in the same round) did not do
# that work in its timed window: it measured something else (batches made before the window
# opened, samples not loaded), and the table says so instead of printing the number. The
# margin is the bound's own round-to-round spread on this machine.
ABOVE_BOUND = 1.15


def _above_bound(row) -> str | None:
    share = row.get("share_of_bound")
    if share is None or share <= ABOVE_BOUND:
        return None
    return (f"ERROR: measured {row['samples_per_s']:.0f} samples/s, {share:.1f}x the bound of "
            f"the work itself ({row['bound_samples_per_s']:.0f}/s on this machine): no loader "
            "doing this work can; the run measured something else (batches made before its "
            "timed window, or samples it did not load)")


def summarize(runs, workloads, loaders):
    table = []
    for wl in workloads:
        torch_rows = {r["round"]: r for r in runs
                      if r["workload"] == wl and r["loader"] == "torch" and "error" not in r}
        bounds = {r["round"]: r["bound_samples_per_s"] for r in runs
                  if r["workload"] == wl and r["loader"] == "bound" and "error" not in r}
        for who in loaders:
            rows = [r for r in runs if r["workload"] == wl and r["loader"] == who]
            ok = [r for r in rows if "error" not in r]
            if not ok:
                table.append({"workload": wl, "loader": who,
                              "error": rows[0]["error"] if rows else "not run"})
                continue
            ratios = [r["samples_per_s"] / torch_rows[r["round"]]["samples_per_s"]
                      for r in ok if r["round"] in torch_rows
                      and torch_rows[r["round"]]["samples_per_s"] > 0]
            shares = [r["samples_per_s"] / bounds[r["round"]] for r in ok
                      if bounds.get(r["round"])]
            table.append({
                "workload": wl,
                "loader": who,
                "workers": ok[0]["workers"],
                "samples_per_s": _median(ok, "samples_per_s"),
                "ratio_vs_torch": statistics.median(ratios) if ratios else None,
                "bound_samples_per_s": statistics.median(bounds.values()) if bounds else None,
                "share_of_bound": statistics.median(shares) if shares else None,
                "main_cpu_ms_per_batch": _median(ok, "main_cpu_ms_per_batch"),
                "pss_total_mb": _median(ok, "pss_total_mb"),
                "pss_single_process_mb": _median(ok, "pss_single_process_mb"),
                "syscalls_per_batch": _median(ok, "syscalls_per_batch"),
                "time_to_first_batch_s": _median(ok, "time_to_first_batch_s"),
                "batch_mb": _median(ok, "batch_bytes") / 2**20,
            })
            problem = _above_bound(table[-1])
            if problem:
                row = table[-1]
                row["measured_samples_per_s"] = row.pop("samples_per_s")
                row["ratio_vs_torch"] = row["share_of_bound"] = None
                row["error"] = problem
        torch_row = next((r for r in table if r["workload"] == wl and r["loader"] == "torch"),
                         None)
        if torch_row is not None and "error" in torch_row:
            for r in table:  # a ratio to a number that is not one is none either
                if r["workload"] == wl and "ratio_vs_torch" in r:
                    r["ratio_vs_torch"] = None
    return table


def print_table(table, out=sys.stdout):
    head = (f"{'workload':9} {'loader':10} {'samples/s':>10} {'vs torch':>9} {'bound/s':>8} "
            f"{'of bound':>8} {'main ms/b':>10} "
            f"{'PSS MB':>8} {'PSS/1proc':>9} {'rw sys/b':>9} {'1st batch':>10}")
    print(head, file=out)
    print("-" * len(head), file=out)
    for row in table:
        if "error" in row:
            what = row["error"] if row["error"].startswith("ERROR") else \
                f"skipped: {row['error']}"
            print(f"{row['workload']:9} {row['loader']:10} {what}", file=out)
            continue
        pss_ratio = None
        if row["pss_total_mb"] and row["pss_single_process_mb"]:
            pss_ratio = row["pss_total_mb"] / row["pss_single_process_mb"]
        print(
            f"{row['workload']:9} {row['loader']:10} {_fmt(row['samples_per_s'], '10.0f')} "
            f"{_fmt(row['ratio_vs_torch'], '8.2f')}x {_fmt(row['bound_samples_per_s'], '8.0f')} "
            f"{_fmt(row['share_of_bound'], '8.2f')} {_fmt(row['main_cpu_ms_per_batch'], '10.2f')} "
            f"{_fmt(row['pss_total_mb'], '8.0f')} {_fmt(pss_ratio, '8.2f')}x "
            f"{_fmt(row['syscalls_per_batch'], '9.1f')} "
            f"{_fmt(row['time_to_first_batch_s'] * 1e3, '8.0f')}ms",
            file=out,
        )


def plot(path, workers_list, loaders, workload="image"):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for who in loaders:
        ys = []
        for w in workers_list:
            res = harness.run(who, workload, w)
            ys.append(res.get("samples_per_s", 0.0))
        ax.plot(workers_list, ys, marker="o", label=who)
    ax.set_xlabel("num_workers")
    ax.set_ylabel("samples/s")
    ax.set_title(f"'{workload}' workload: throughput against num_workers")
    ax.set_xticks(workers_list)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="stoker bench", description=__doc__)
    ap.add_argument("--workers", type=int, default=2, help="num_workers (metadata uses 4)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of A/B alternation")
    ap.add_argument("--workloads", default=",".join(DEFAULT),
                    help=f"comma-separated, from {','.join(WORKLOADS)}, and remote (samples "
                         "over HTTP: torch's 2, 8, 32 workers against stoker's threads and "
                         "async; not in the default list)")
    ap.add_argument("--latency-ms", type=float, default=20.0,
                    help="remote: the object store's latency per request")
    ap.add_argument("--no-peers", action="store_true", help="only stoker and torch")
    ap.add_argument("--start-method", choices=["fork", "spawn", "forkserver"],
                    help="multiprocessing_context for torch and stoker (default: Python's)")
    ap.add_argument("--json", metavar="FILE", help="write every run and the summary as JSON")
    ap.add_argument("--plot", metavar="FILE.png",
                    help="also sweep num_workers 1..4 on 'image' and plot throughput")
    ap.add_argument("--autotune", action="store_true",
                    help="only the autotune scenarios: fixed num_workers 1..CPUs against 'auto', "
                         "fixed prefetch_factor 1, 2, 4, 8 against 'auto'")
    ap.add_argument("--autotune-batches", type=int, default=160,
                    help="batches per run of the num_workers scenario (the prefetch one runs 1000)")
    ap.add_argument("--threads", action="store_true",
                    help="only the thread scenarios (for a free-threaded Python): stoker's 1 "
                         "worker at threads_per_worker 1, 2, auto and num_workers=0 with 2 "
                         "threads, against torch's 1 and 2 workers, on --workloads (default "
                         "decode,compute)")
    ap.add_argument("--main-cost", action="store_true",
                    help="only the main process's own CPU per batch and per tensor")
    ap.add_argument("--placement", choices=["local", "ray", "node"], default="local",
                    help="ray: also run stoker with its workers as Ray actors ('stoker-ray'); "
                         "node (with --ranks): also the ranks served by one pool for the node")
    ap.add_argument("--ray-address", metavar="ADDR",
                    help="the Ray cluster for --placement ray (as ray.init takes it)")
    ap.add_argument("--ranks", type=int, metavar="R",
                    help="only the multi-rank scenarios: R ranks of one job on this machine, "
                         "each its own loader (num_workers=\"auto\"; a skewed lock-step epoch)")
    ap.add_argument("--rank-workers", default="auto", metavar="N",
                    help="with --ranks: each rank's num_workers in the first scenario (an int, "
                         "or auto); the node's pool keeps its own bound (auto)")
    args = ap.parse_args(argv)
    if args.ranks is not None:
        if args.ranks < 1:
            ap.error("--ranks takes a count of 1 or more")
        if args.placement == "ray":
            ap.error("--ranks runs local workers, and with --placement node the node's pool")
        from . import ranks

        placements = ("local", "node") if args.placement == "node" else ("local",)
        per_rank = args.rank_workers if args.rank_workers == "auto" else int(args.rank_workers)
        result = ranks.main(args.ranks, rounds=args.rounds, placements=placements,
                            rank_workers=per_rank)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
        return 0
    if args.threads:
        from . import threads

        chosen = tuple(w for w in args.workloads.split(",") if w)
        if args.workloads == ",".join(DEFAULT):  # not given: the thread workloads
            chosen = threads.WORKLOADS
        unknown = [w for w in chosen if w not in WORKLOADS]
        if unknown:
            ap.error(f"unknown workloads: {unknown}")
        result = threads.main(chosen, rounds=args.rounds)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
        return 0
    if args.main_cost:
        from . import main_cost

        result = main_cost.main()
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
        return 0
    if args.autotune:
        from . import autotune

        result = autotune.main(args.autotune_batches, rounds=args.rounds)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
        return 0
    workloads = [w for w in args.workloads.split(",") if w]
    unknown = [w for w in workloads if w not in WORKLOADS and w != "remote"]
    if unknown:
        ap.error(f"unknown workloads: {unknown}")
    if "remote" in workloads:
        from . import remote

        result = remote.main(args.latency_ms, rounds=args.rounds)
        workloads.remove("remote")
        if not workloads:
            if args.json:
                with open(args.json, "w") as f:
                    json.dump({"remote": result}, f, indent=1)
            return 0
    loaders = ["torch", "stoker"]
    skipped = []
    if args.placement == "ray":
        loaders.append("stoker-ray")
        if args.ray_address:
            os.environ[harness.RAY_ADDRESS_ENV] = args.ray_address
    if not args.no_peers:
        for p in peers.PEERS:
            ok, why = peers.available(p)
            if ok:
                loaders.append(p)
            else:
                skipped.append((p, why))
    runs = bench(workloads, loaders, args.workers, args.rounds, start_method=args.start_method)
    table = summarize(runs, workloads, loaders)
    print_table(table)
    for p, why in skipped:
        print(f"peer {p} skipped: {why}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": runs, "summary": table, "skipped_peers": skipped}, f, indent=1)
    if args.plot:
        plot(args.plot, [1, 2, 3, 4], loaders)
        print(f"plot written to {args.plot}")
    return 0
