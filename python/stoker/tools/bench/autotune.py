"""``stoker bench --autotune``: num_workers="auto" against the best fixed num_workers, and
prefetch_factor="auto" against the best fixed prefetch_factor.

Workers: the scenario where the right count is not obvious: workers decode JPEGs (random crop
and flip) and the training step itself takes a core: a fixed amount of CPU work in the main
process (as a CPU-side step or a host-side launch loop), calibrated on an idle core to last about
as long as loading a batch takes (CPUs - 1) / 1.5 workers. Fixed work, not a wall-clock spin: a
step that spins until a deadline loses nothing when a worker takes its core, which makes too
many workers look free. Every fixed count from 1 to the usable CPUs is run, then "auto".

Depth: two workers read 64 KiB samples from remote storage with a latency tail (``READ_S`` a
read, one in ``TAIL_EVERY`` takes ``TAIL_S``, drawn per index) and a training step that leaves
the CPU free (an accelerator's: a sleep of ``STEP_S``). A slow read holds the line: the loop
waits for it while the other worker runs out of work unless it may hold more batches.
prefetch_factor 1, 2, 4, 8 and "auto" are run, ``DEPTH_BATCHES`` batches each.

Short epoch: a 3,000-sample epoch of ``fields`` (16 small tensors, 4 ints, 2 strings a sample,
batch 64) that lasts well under a second, as a validation pass does, with no training step
("light") and with ``SHORT_STEP_S`` of CPU work a batch ("heavy"): fixed 1 .. CPUs workers and
"auto", each a fresh process and loader, throughput over the whole epoch from ``iter()`` (start-up
included: that is what a short epoch pays); then a second loader on the same dataset in the same
process, which starts from what the first learnt.

Each run is a fresh interpreter. The num_workers settings run ``ROUNDS`` times each, in an
order that rotates every round, and the median counts: on a shared machine the speed drifts by
10-20% within a minute, more than the settings differ. Throughput is taken over the second half
of a run (the steady state); for "auto", the table also says after how many batches a sliding window of ``WINDOW``
batches first reached 95% of the best fixed setting's throughput.
"""

from __future__ import annotations

import random
import sys
import time

WINDOW = 16  # batches in the sliding throughput window
ROUNDS = 3  # the num_workers scenario runs each setting this often (rotating order)
BATCH = 16
READ_S = 0.0005  # a read from the remote store
TAIL_EVERY = 128  # one read in this many is slow
TAIL_S = 0.1  # and takes this long
STEP_S = 0.004  # the accelerator's step (the CPU is free meanwhile)
DEPTHS = (1, 2, 4, 8)
DEPTH_BATCHES = 1000
DEPTH_WINDOW = 100  # batches: a random tail needs a long window to average out
SHORT_SAMPLES = 3000
SHORT_BATCH = 64
SHORT_STEP_S = 0.003


def _dataset(n):
    from .workloads import JpegDecode

    return JpegDecode(n)


class RemoteReads:
    """64 KiB samples read from a store with a latency tail: which reads are slow is drawn per
    index (the same in every run and every process)."""

    def __init__(self, n):
        import numpy as np

        self.n = n
        self.blob = np.random.default_rng(0).integers(0, 255, 1 << 16, dtype=np.uint8)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch

        slow = random.Random(i).random() < 1 / TAIL_EVERY
        time.sleep(TAIL_S if slow else READ_S)
        return torch.from_numpy(self.blob.copy())


def decode_s_per_batch() -> float:
    """Seconds one worker takes to load a batch (no tail)."""
    ds = _dataset(BATCH * 4)
    t = time.perf_counter()
    for i in range(BATCH * 4):
        ds[i]
    return (time.perf_counter() - t) / 4


def calibrate_step_s(cpus: int) -> float:
    """A training step about as long as loading a batch takes (cpus - 1) / 1.5 workers: the
    best count is neither 1 nor all CPUs when there are a few."""
    return decode_s_per_batch() / max(1.0, (cpus - 1) / 1.5)


def step_work(n: int) -> int:
    """The training step's CPU work: `n` rounds of integer arithmetic."""
    x = 0
    for i in range(n):
        x += i * i
    return x


def calibrate_work(step_s: float) -> int:
    """The rounds of ``step_work`` that take `step_s` on this (idle) core: the best of 5."""
    n = 200_000
    best = min(_timed(step_work, n) for _ in range(5))
    return max(1, int(n * step_s / best))


def _timed(fn, *args) -> float:
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def run_in_process(num_workers, batches: int, step, prefetch_factor=None,
                   remote: bool = False) -> dict:
    """`step`: the training step, seconds of sleep with `remote`, else rounds of step_work."""
    import stoker

    ds = RemoteReads(BATCH * batches) if remote else _dataset(BATCH * batches)
    dl = stoker.DataLoader(ds, batch_size=BATCH, num_workers=num_workers,
                           prefetch_factor=prefetch_factor)
    stamps = []
    for _ in dl:
        if remote:  # the accelerator's step: the CPU is free meanwhile
            time.sleep(step)
        else:  # the training step: one core, busy
            step_work(step)
        stamps.append(time.perf_counter())
    half = len(stamps) // 2
    steady = (len(stamps) - half - 1) * BATCH / (stamps[-1] - stamps[half])
    out = {"num_workers": num_workers, "prefetch_factor": prefetch_factor,
           "samples_per_s": steady, "stamps": stamps, "workers": dl.num_workers}
    auto = dl.stats().get("autotune")
    if auto:
        out["active_workers"] = auto["active_workers"]
        out["final_prefetch_factor"] = auto["prefetch_factor"]
        out["decisions"] = auto["decisions"]
    return out


def _run(num_workers, batches, step, prefetch_factor=None, remote=False, timeout=300) -> dict:
    from .harness import in_fresh_interpreter

    res, stderr = in_fresh_interpreter(
        "autotune", "run_in_process", (num_workers, batches, step, prefetch_factor, remote),
        timeout)
    if res is None:
        raise RuntimeError(f"num_workers={num_workers!r}: {stderr.strip()[-2000:]}")
    return res


def short_in_process(num_workers, work: int) -> dict:
    """One short epoch of a fresh loader, then one of a second loader on the same dataset."""
    import stoker

    from .workloads import ManyFields

    ds = ManyFields(SHORT_SAMPLES)
    out = {"num_workers": num_workers}
    for run in ("first", "second"):
        dl = stoker.DataLoader(ds, batch_size=SHORT_BATCH, num_workers=num_workers)
        t = time.perf_counter()
        n = 0
        for b in dl:
            n += len(b["i0"])
            if work:
                step_work(work)
        out[run] = n / (time.perf_counter() - t)
        auto = dl.stats().get("autotune")
        if auto:
            out[run + "_workers"] = auto["active_workers"]
            out[run + "_decisions"] = [(d["batch"], d["active"]) for d in auto["decisions"]]
        del dl
    out["samples_per_s"] = out["first"]
    return out


def short_scenario(rounds: int = ROUNDS, out=sys.stdout) -> dict:
    """The short-epoch tables (module doc), light and heavy step."""
    from ...common.system import usable_cpus
    from .harness import in_fresh_interpreter

    cpus = usable_cpus()
    work = calibrate_work(SHORT_STEP_S)
    result = {}
    for step, w in (("light", 0), ("heavy", work)):
        def run(k, w=w):
            res, stderr = in_fresh_interpreter("autotune", "short_in_process", (k, w), 120)
            if res is None:
                raise RuntimeError(f"num_workers={k!r}: {stderr.strip()[-2000:]}")
            return res
        print(f"short epoch, {step} step ({1e3 * SHORT_STEP_S if w else 0:g} ms of CPU a batch): "
              f"{SHORT_SAMPLES} samples of fields, batch {SHORT_BATCH}, whole epoch from iter(); "
              f"{rounds} rounds, the median", file=out)
        *fixed, auto = interleaved(list(range(1, cpus + 1)) + ["auto"], run, rounds)
        best = max(fixed, key=lambda r: r["first"])
        print(f"{'workers':>8} {'1st loader':>10} {'of best':>7} {'2nd loader':>10} {'of best':>7}"
              "  rounds (1st loader)", file=out)
        for r in fixed + [auto]:
            name = (f"auto->{r.get('first_workers')},{r.get('second_workers')}" if r is auto
                    else str(r["num_workers"]))
            print(f"{name:>8} {r['first']:10.0f} {100 * r['first'] / best['first']:6.0f}% "
                  f"{r['second']:10.0f} {100 * r['second'] / best['second']:6.0f}%  "
                  f"{' '.join(f'{x:.0f}' for x in r['rounds'])}", file=out)
        result[step] = {"fixed": fixed, "auto": auto, "best": best["num_workers"],
                        "auto_share": auto["first"] / best["first"],
                        "next_loader_share": auto["second"] / best["second"]}
    return result


def batches_to_reach(stamps, target_samples_per_s, window: int = WINDOW) -> int | None:
    """The first batch at which the last `window` batches ran at `target` or faster."""
    for i in range(window, len(stamps)):
        rate = window * BATCH / (stamps[i] - stamps[i - window])
        if rate >= target_samples_per_s:
            return i + 1
    return None


def interleaved(settings, run, rounds: int) -> list[dict]:
    """Runs every setting `rounds` times, the order rotating each round (the machine's speed
    drifts: a setting always run last would pay for it); per setting, the run with the median
    throughput, with every round's throughput in ``"rounds"``."""
    runs: dict = {i: [] for i in range(len(settings))}
    for r in range(rounds):
        for k in range(len(settings)):
            i = (k + r) % len(settings)
            runs[i].append(run(settings[i]))
    out = []
    for i in range(len(settings)):
        ordered = sorted(runs[i], key=lambda x: x["samples_per_s"])
        median = dict(ordered[len(ordered) // 2])
        median["rounds"] = [x["samples_per_s"] for x in runs[i]]
        out.append(median)
    return out


def main(batches: int = 160, out=sys.stdout, rounds: int = ROUNDS) -> dict:
    from ...common.system import usable_cpus

    cpus = usable_cpus()
    step_s = calibrate_step_s(cpus)
    work = calibrate_work(step_s)
    print(f"autotune scenario: JPEG decode in workers ({BATCH} per batch), a training step of "
          f"{1e3 * step_s:.1f} ms of CPU work on an idle core; {cpus} usable CPUs; {batches} "
          f"batches a run, {rounds} rounds in rotating order, the median of each", file=out)
    *fixed, auto = interleaved(list(range(1, cpus + 1)) + ["auto"],
                               lambda k: _run(k, batches, work), rounds)
    best, reached = _report(fixed, auto, "num_workers", "active_workers", "active", WINDOW,
                            "count", out)
    short = short_scenario(rounds, out)
    depth = depth_scenario(DEPTH_BATCHES, out)
    return {"fixed": fixed, "auto": auto, "best": best["num_workers"], "reached_at": reached,
            "step_s": step_s, "step_work": work, "short": short, "depth": depth}


def _report(fixed, auto, setting, final, decided, window, what, out):
    """Prints the table of one scenario; (the best fixed run, the batch at which a `window`
    of "auto" first ran at 95% of it)."""
    best = max(fixed, key=lambda r: r["samples_per_s"])
    reached = batches_to_reach(auto["stamps"], 0.95 * best["samples_per_s"], window)
    rounds = "rounds" in best
    print(f"{setting:>15} {'samples/s':>10} {'of best':>8}" + ("  rounds" if rounds else ""),
          file=out)
    for r in fixed + [auto]:
        name = str(r[setting]) + (f" (->{r.get(final)})" if r is auto else "")
        tail = f"  {' '.join(f'{x:.0f}' for x in r['rounds'])}" if rounds else ""
        print(f"{name:>15} {r['samples_per_s']:10.0f} "
              f"{100 * r['samples_per_s'] / best['samples_per_s']:7.0f}%{tail}", file=out)
    changes = [(d["batch"], d[decided]) for d in auto.get("decisions", [])]
    print(f"auto: {100 * auto['samples_per_s'] / best['samples_per_s']:.0f}% of the best fixed "
          f"{what} ({best[setting]}); a {window}-batch window first reached 95% of it at batch "
          f"{reached if reached is not None else 'never'}; (batch, {decided}): {changes}",
          file=out)
    return best, reached


def depth_scenario(batches: int, out=sys.stdout) -> dict:
    """prefetch_factor 1, 2, 4, 8 and "auto" on remote reads with a latency tail (module doc)."""
    print(f"\nprefetch scenario: 2 workers read {BATCH} samples a batch from remote storage "
          f"({1e3 * READ_S:g} ms a read, one in {TAIL_EVERY} takes {1e3 * TAIL_S:g} ms), an "
          f"accelerator step of {1e3 * STEP_S:g} ms (sleep); {batches} batches a run", file=out)
    fixed = [_run(2, batches, STEP_S, d, remote=True) for d in DEPTHS]
    auto = _run(2, batches, STEP_S, "auto", remote=True)
    best, reached = _report(fixed, auto, "prefetch_factor", "final_prefetch_factor",
                            "prefetch_factor", DEPTH_WINDOW, "depth", out)
    return {"fixed": fixed, "auto": auto, "best": best["prefetch_factor"],
            "reached_at": reached, "step_s": STEP_S, "read_s": READ_S, "tail_s": TAIL_S,
            "tail_every": TAIL_EVERY}
