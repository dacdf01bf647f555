"""A chaos soak: one loader after another, for minutes, while a thread kills their workers at
random moments, with every kind of death: `python tests/soak/chaos.py --seconds 600`
(`make soak`; tests/test_soak.py runs it for about 25 s).

Phases rotate until the time is up, each a fresh loader run for a few epochs:

- fork, persistent workers, flaky samples under on_error="retry";
- fork, workers anew every epoch, flaky samples under on_error="skip" and a poison sample that
  segfaults whenever it is loaded (quarantined after its second death);
- spawn, persistent workers, retry (a worker's start-up lasts long enough to be killed in it);
- fork, in_order=False, retry;
- the node's pool (placement=stoker.Node()), retry: its workers killed, and now and then the
  pool itself;
- fork, persistent, skip with a poison sample, threads_per_worker=8: a kill takes a batch
  whose samples load at once (re-issued one sample at a time, so the poison is still named);
- with --ray-address (tests/soak/with_ray.sh starts a cluster), Ray actors, retry: their
  processes killed by the pids they give.

The killer sends SIGKILL, SIGSEGV, SIGTERM, SIGBUS or SIGABRT to a random worker every
0.1-0.4 s (0.6-1.2 s under spawn, whose workers take a second to start), busy or idle, and one time in four goes for a worker that is starting: one the
loader lists as "starting", or a new child process that has no status page yet. It spares a
worker loading a sample it already killed a worker on this epoch: two deaths on one sample
make it poison, by design, and the soak's own poison sample is what tests that.

The loop holds up to 8 batches at a time and drops them at random, and checks each batch's
values when it arrives and again when it is dropped (a slot reused under a held batch would
show). Checked per epoch: the indices are the sampler's, in its order (in_order=True), each
exactly once, less only the samples the loader reports skipped (flaky ones under "skip", the
poison one), and every value is right. Checked per phase, after its warm-up epochs: the main
process's RSS, descriptors, threads and memory mappings stay flat; after it: no process, fd or
thread is left. Prints a JSON report; exits 1 when anything failed.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import signal
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

import torch  # noqa: E402
from soak_data import Chaos, Recorded, check_batch, flaky  # noqa: E402

import stoker  # noqa: E402

SIGNALS = [(signal.SIGKILL, 50), (signal.SIGSEGV, 20), (signal.SIGTERM, 10),
           (signal.SIGBUS, 10), (signal.SIGABRT, 10)]
BUSY = ("loading", "collating", "encoding")
WARM_EPOCHS = 2
MIN_EPOCHS = 2  # a phase's, each time its turn comes


def _resources() -> dict:
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    with open("/proc/self/maps") as f:
        maps = sum(1 for _ in f)
    return {"rss_mb": int(status["VmRSS"].split()[0]) / 1024,
            "fds": len(os.listdir("/proc/self/fd")), "threads": int(status["Threads"]),
            "maps": maps}


def _live_children(parent: int) -> list[tuple[int, bytes]]:
    """(pid, cmdline) of `parent`'s children that run (zombies left out)."""
    out = []
    try:
        tasks = os.listdir(f"/proc/{parent}/task")
    except OSError:
        return out
    kids = set()
    for t in tasks:
        try:
            with open(f"/proc/{parent}/task/{t}/children") as f:
                kids.update(int(k) for k in f.read().split())
        except OSError:
            pass
    for pid in sorted(kids):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in "ZX":
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                out.append((pid, f.read()))
        except OSError:
            pass
    return out


def _children() -> list[int]:
    """This process's children that are workers (not multiprocessing's resource tracker or
    fork server, which spawn and forkserver start once for the process)."""
    return [pid for pid, cmd in _live_children(os.getpid())
            if b"resource_tracker" not in cmd and b"forkserver" not in cmd]


def _pool_workers(pool: dict) -> list[int]:
    """The node pool's workers for this loader's dataset as they are now: what the rank's
    stats() names (the pool tells each rank when one starts or ends), those alive."""
    return [pid for pid in pool.get("pids") or () if os.path.exists(f"/proc/{pid}")]


class Killer(threading.Thread):
    """Kills a random worker of `loader` every `low`-`high` seconds while `on` is set."""

    def __init__(self, rng: random.Random, low=0.2, high=0.6, pool_every=0):
        super().__init__(daemon=True, name="soak-killer")
        self.rng, self.low, self.high, self.pool_every = rng, low, high, pool_every
        self.loader = None
        self.on = threading.Event()
        self.stop = threading.Event()
        self.killed_on: set = set()  # indices a kill landed on this epoch
        # new children of this process count as starting workers (not under Ray, whose
        # actors are the raylet's children: there only the pids the actors give are killed)
        self.starting_kills = True
        self.kills: dict = {}
        self.moments: dict = {"busy": 0, "idle": 0, "starting": 0, "pool": 0}
        self._n = 0

    def _signal(self) -> int:
        total = sum(w for _, w in SIGNALS)
        r = self.rng.uniform(0, total)
        for sig, w in SIGNALS:
            r -= w
            if r <= 0:
                return sig
        return signal.SIGKILL

    def _send(self, pid: int, sig: int, moment: str) -> None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        name = signal.Signals(sig).name
        self.kills[name] = self.kills.get(name, 0) + 1
        self.moments[moment] += 1

    def _workers(self):
        st = self.loader.stats()
        pool = st.get("pool")
        if pool:  # node placement: the pool's processes, not the rank's virtual workers
            return [{"pid": p, "state": "?", "index": None}
                    for p in _pool_workers(pool)], pool
        return [w for w in st["workers"] if w.get("alive") and w.get("pid")], None

    def _kill_one(self) -> None:
        workers, pool = self._workers()
        self._n += 1
        if pool and self.pool_every and self._n % self.pool_every == 0:
            self._send(pool["pid"], signal.SIGKILL, "pool")
            return
        if not pool and self.starting_kills and self.rng.random() < 0.25:  # one starting
            known = {w["pid"] for w in workers}
            deadline = time.monotonic() + 0.3
            while time.monotonic() < deadline and self.on.is_set():
                fresh = [p for p in _children() if p not in known]
                starting = [w["pid"] for w in self._workers()[0] if w["state"] == "starting"]
                if fresh or starting:
                    self._send(self.rng.choice(fresh or starting), self._signal(), "starting")
                    return
                time.sleep(0.01)
            return
        spare = self.killed_on
        choice = [w for w in workers
                  if not (w["state"] in BUSY and w.get("index") in spare)]
        if not choice:
            return
        w = self.rng.choice(choice)
        if w["state"] in BUSY and w.get("index") is not None:
            spare.add(w["index"])
        self._send(w["pid"], self._signal(), "busy" if w["state"] in BUSY else
                   "starting" if w["state"] == "starting" else "idle")

    def run(self) -> None:
        while not self.stop.is_set():
            time.sleep(self.rng.uniform(self.low, self.high))
            if self.on.is_set() and self.loader is not None:
                try:
                    self._kill_one()
                except Exception as e:  # noqa: BLE001 (a loader between epochs; reported)
                    self.kills["errors"] = self.kills.get("errors", 0) + 1
                    self.last_error = repr(e)


PHASES = [
    dict(name="fork-persistent-retry", context="fork", persistent=True, on_error="retry"),
    dict(name="fork-skip-poison", context="fork", persistent=False, on_error="skip", poison=True),
    dict(name="spawn-persistent-retry", context="spawn", persistent=True, on_error="retry",
         slow_kills=True),
    dict(name="fork-unordered-retry", context="fork", persistent=True, on_error="retry",
         in_order=False),
    dict(name="node-retry", context=None, persistent=True, on_error="retry", node=True),
    # many samples in flight in each worker: a kill takes a whole batch loading at once
    dict(name="fork-threads-skip-poison", context="fork", persistent=True, on_error="skip",
         poison=True, threads=8),
]
# With --ray-address (a cluster on this machine: tests/soak/with_ray.sh starts one): workers
# as Ray actors, their processes killed as the others'.
RAY_PHASE = dict(name="ray-retry", context=None, persistent=True, on_error="retry",
                 slow_kills=True, ray=True)


class Failed(AssertionError):
    pass


def run_phase(spec: dict, killer: Killer, until: float, rng: random.Random, n: int,
              report: dict) -> None:
    poison = {n // 3} if spec.get("poison") else set()
    ds = Chaos(n, flaky_every=97, poison=poison)
    sampler = Recorded(n, rng.randrange(1 << 30))
    # Two deaths while loading one sample make it poison, by design: the killer spares a worker
    # loading a sample it killed one on, but a kill can land on a re-issued sample before the
    # killer sees it there. Only the phase with a poison sample keeps the default.
    kw = dict(batch_size=8, sampler=sampler, num_workers=2, on_error=spec["on_error"],
              max_retries=3, max_restarts=1_000_000, persistent_workers=spec["persistent"],
              in_order=spec.get("in_order", True),
              quarantine_after=2 if poison else 1_000_000,
              threads_per_worker=spec.get("threads", 1))
    if spec.get("context"):
        kw["multiprocessing_context"] = spec["context"]
    if spec.get("node"):
        kw["placement"] = stoker.Node(workers=2, name=f"soak-{os.getpid()}")
    if spec.get("ray"):
        kw["placement"] = stoker.Ray(address=spec["address"])
    loader = stoker.DataLoader(ds, **kw)
    killer.loader = loader
    killer.low, killer.high = (0.6, 1.2) if spec.get("slow_kills") else (0.1, 0.4)
    killer.pool_every = 12 if spec.get("node") else 0
    killer.starting_kills = not spec.get("ray")
    phase = report["phases"].setdefault(spec["name"], {"epochs": 0, "batches": 0,
                                                       "resources": []})
    epochs = 0
    while epochs < MIN_EPOCHS or time.monotonic() < until:
        held: list = []
        got: list = []
        killer.killed_on = set()
        skipped_before = len(loader.skipped)
        killer.on.set()
        for b in loader:
            got.extend(check_batch(b))
            held.append(b)
            while len(held) > 8 or (held and rng.random() < 0.4):
                check_batch(held.pop(rng.randrange(len(held))))  # still intact?
            report["batches"] += 1
            phase["batches"] += 1
        killer.on.clear()
        for b in held:
            check_batch(b)
        del held, b
        order = sampler.orders[-1]
        skipped = [int(s.index) for s in loader.skipped[skipped_before:]]
        quarantined = {int(i) for i in loader.stats()["quarantined"]}
        for i in skipped + sorted(quarantined):
            if not (flaky(i, ds.flaky_every) or i in poison):
                raise Failed(f"{spec['name']}: sample {i} was skipped but never failed")
        if quarantined - poison:
            raise Failed(f"{spec['name']}: quarantined {sorted(quarantined - poison)}, "
                         "which are not poison")
        gone = set(skipped) | quarantined  # a quarantined sample stays out of later epochs
        want = [i for i in order if i not in gone]
        if not spec.get("in_order", True):
            got, want = sorted(got), sorted(want)
        if got != want:
            lost = sorted(set(want) - set(got))
            dup = sorted({i for i in got if got.count(i) > 1})
            raise Failed(f"{spec['name']} epoch {epochs}: lost {lost[:20]}, duplicated "
                         f"{dup[:20]}, in order: {got == want}")
        epochs += 1
        report["epochs"] += 1
        phase["epochs"] += 1
        report["skipped"] += len(skipped)
        gc.collect()
        phase["resources"].append(_resources())
    deaths = len(loader.deaths)
    report["deaths"] += deaths
    phase["deaths"] = phase.get("deaths", 0) + deaths
    killer.loader = None
    del loader
    gc.collect()
    if spec.get("ray"):
        _ray_actors_gone()
    _check_flat(spec["name"], phase["resources"])


def _ray_actors_gone(within: float = 60.0) -> None:
    """Every CPU of the cluster is free again: no actor of the loader is left."""
    import ray

    deadline = time.monotonic() + within
    total = ray.cluster_resources().get("CPU", 0)
    while ray.available_resources().get("CPU", 0) < total:
        if time.monotonic() > deadline:
            raise Failed(f"Ray actors left: {ray.available_resources()} of {total} CPUs free")
        time.sleep(0.5)


def _check_flat(name: str, samples: list) -> None:
    """After the warm-up epochs, nothing grows: the last epochs' peak is within a margin of the
    warm-up's (held batches are dropped and the garbage collected before each sample)."""
    if len(samples) <= WARM_EPOCHS + 1:
        return
    warm = samples[:WARM_EPOCHS + 1]
    late = samples[len(samples) // 2:]
    margin = {"rss_mb": max(24.0, 0.1 * max(s["rss_mb"] for s in warm)), "fds": 4,
              "threads": 2, "maps": 24}
    for key, m in margin.items():
        top, now = max(s[key] for s in warm), max(s[key] for s in late)
        if now > top + m:
            raise Failed(f"{name}: {key} grew from {top} to {now} over the phase "
                         f"({[s[key] for s in samples]})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--samples", type=int, default=400, help="samples an epoch")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--phases", default=",".join(p["name"] for p in PHASES))
    ap.add_argument("--json", default=None, help="write the report here too")
    ap.add_argument("--ray-address", default=None,
                    help="a Ray cluster on this machine: adds the phase with Ray actors")
    args = ap.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    chosen = [p for p in PHASES if p["name"] in args.phases.split(",")]
    if args.ray_address:
        import ray

        ray.init(address=args.ray_address, logging_level="error", log_to_driver=False)
        # first: the Ray driver opens its channels and threads with its first actors, and
        # what is left at the end is counted from after that phase's first turn
        chosen.insert(0, dict(RAY_PHASE, address=args.ray_address))
    report = {"seed": seed, "seconds": args.seconds, "epochs": 0, "batches": 0, "deaths": 0,
              "skipped": 0, "phases": {}, "ok": False}
    before = {"fds": len(os.listdir("/proc/self/fd")), "threads": threading.active_count()}
    killer = Killer(random.Random(seed + 1))
    killer.start()
    t0 = time.monotonic()
    end = t0 + args.seconds
    slice_s = max(4.0, args.seconds / (2 * len(chosen)))
    k = 0
    try:
        while True:
            spec = chosen[k % len(chosen)]
            run_phase(spec, killer, min(end, time.monotonic() + slice_s), rng, args.samples,
                      report)
            if k == 0 and spec.get("ray"):
                before = {"fds": len(os.listdir("/proc/self/fd")),
                          "threads": threading.active_count()}
            k += 1
            if time.monotonic() >= end and k >= len(chosen):
                break
        killer.stop.set()
        killer.join(2)
        gc.collect()
        deadline = time.monotonic() + 20
        while _children() and time.monotonic() < deadline:
            time.sleep(0.2)
        left = _children()
        if left:
            raise Failed(f"processes left: {left}")
        fds = len(os.listdir("/proc/self/fd"))
        if fds > before["fds"] + 2:
            raise Failed(f"descriptors left: {before['fds']} before, {fds} after")
        threads = threading.active_count()
        if threads > before["threads"]:
            raise Failed(f"threads left: {threading.enumerate()}")
        if killer.kills.get("errors"):
            raise Failed(f"the killer's stats() failed {killer.kills['errors']} time(s): "
                         f"{killer.last_error}")
        report["ok"] = True
    except Failed as e:
        report["failure"] = str(e)
    except Exception as e:  # noqa: BLE001 (a run that ended: what the soak is there to catch)
        report["failure"] = f"{type(e).__name__}: {e}"
    finally:
        killer.stop.set()
        elapsed = time.monotonic() - t0
        report["elapsed_s"] = round(elapsed, 1)
        report["kills"] = dict(killer.kills)
        report["kill_moments"] = dict(killer.moments)
        survived = sum(v for kk, v in killer.kills.items() if kk != "errors")
        report["kills_survived"] = survived if report["ok"] else None
        report["kills_per_minute"] = round(60 * survived / elapsed, 1) if elapsed else 0
        for phase in report["phases"].values():
            res = phase.pop("resources")
            if res:
                phase["first"], phase["last"] = res[0], res[-1]
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
