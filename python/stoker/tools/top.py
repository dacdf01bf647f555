"""``stoker top``: every stoker loader on this machine, and a live view of one.

Loaders are found through ``/proc``: a main process holds its board ("stoker-board") and its
workers' status pages ("stoker-status") as memfds, which another process of the same user can
open through ``/proc/PID/fd/N`` and map read-only. No files, no sockets, nothing to clean up.

    stoker top               # every loader, refreshed every second
    stoker top PID           # one loader's workers, refreshed in place
    stoker top --once --json # one snapshot for scripts

A command: one thread; it only reads other processes' pages, read-only.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import sys
import time

import numpy as np

from ..wire.board import (
    BOARD_NAME,
    FIELDS,
    MAGIC,
    NO_INDEX,
    STATES,
    STATUS_FIELDS,
    STATUS_MAGIC,
    STATUS_NAME,
    TUNED_DEPTH,
    TUNED_WORKERS,
)


def _read_memfd(pid: str, fd: str, count: int, dtype) -> np.ndarray | None:
    try:
        f = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY)
    except OSError:
        return None
    try:
        size = os.fstat(f).st_size
        if size < count * 8:
            return None
        with mmap.mmap(f, count * 8, prot=mmap.PROT_READ) as m:
            return np.frombuffer(m, dtype=dtype, count=count).copy()
    except (OSError, ValueError):
        return None
    finally:
        os.close(f)


def _cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def snapshot() -> list[dict]:
    """Every loader on the machine this user can see, with its workers."""
    loaders = []
    now = time.monotonic_ns()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        boards, pages = [], []
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith(f"/memfd:{BOARD_NAME}"):
                boards.append((fd, _label(target)))
            elif target.startswith(f"/memfd:{STATUS_NAME}"):
                pages.append(fd)
        if not boards:
            continue
        workers_by_token: dict = {}
        for fd in pages:
            v = _read_memfd(pid, fd, len(STATUS_FIELDS), np.uint64)
            if v is None or int(v[0]) != STATUS_MAGIC:
                continue
            w = dict(zip(STATUS_FIELDS, (int(x) for x in v)))
            index = int(np.int64(v[STATUS_FIELDS.index("index")].astype(np.int64)))
            state = STATES[w["state"]] if w["state"] < len(STATES) else "?"
            workers_by_token.setdefault(w["loader_token"], []).append({
                "id": w["worker_id"], "pid": w["pid"], "state": state,
                "index": None if index == NO_INDEX else index,
                "state_seconds": max(0, now - w["since_ns"]) / 1e9,
                "samples": w["samples"], "batches": w["batches"], "rss_bytes": w["rss_bytes"],
                # samples loading on the worker's threads now (threads_per_worker); 0: none
                "in_flight": w.get("in_flight", 0),
                "seconds": {s: w[f"ns_{s}"] / 1e9 for s in ("loading", "collating", "encoding",
                                                            "idle")},
            })
        for fd, served_by in boards:
            v = _read_memfd(pid, fd, len(FIELDS), np.int64)
            if v is None or int(v[0]) != MAGIC:
                continue
            b = dict(zip(FIELDS, (int(x) for x in v)))
            elapsed = (now - b["started_ns"]) / 1e9 if b["started_ns"] else 0.0
            tuned = b.get("tuned", 0)
            loaders.append({
                "pid": int(pid), "command": _cmdline(pid)[:120], "served_by": served_by,
                "epoch": b["epoch"],
                "num_workers": b["num_workers"],
                # workers taking tasks now (fewer under num_workers="auto"); a board of
                # version 1 wrote 0 for "all of them"
                "active_workers": b.get("active_workers") or b["num_workers"],
                "batches_yielded": b["batches_yielded"],
                # each worker's queue depth now; None where there is not one (a node pool)
                "prefetch_factor": b.get("prefetch_factor") or None,
                "tuned": {"workers": bool(tuned & TUNED_WORKERS),
                          "prefetch_factor": bool(tuned & TUNED_DEPTH)},
                "data_stall": (b["waited_ns"] / 1e9 / elapsed) if elapsed > 0 else 0.0,
                "deaths": b["deaths"], "restarts": b["restarts"], "skipped": b["skipped"],
                "workers": sorted(workers_by_token.get(b["token"], []), key=lambda w: w["id"]),
            })
    return loaders


def _label(target: str) -> str:
    """Who serves the loader, from its board's memfd name ("/memfd:stoker-board:LABEL
    (deleted)"); boards of older versions have none."""
    name = target[len("/memfd:"):]
    if name.endswith(" (deleted)"):
        name = name[: -len(" (deleted)")]
    _, _, label = name.partition(":")
    return label or "stoker.DataLoader"


def _mb(n) -> str:
    return f"{n / 2**20:7.0f}"


def render(loaders, previous, dt, only_pid=None) -> str:
    lines = []
    if not loaders:
        return "no stoker loader is running (as this user)\n"
    for ld in loaders:
        if only_pid is not None and ld["pid"] != only_pid:
            continue
        lines.append(
            f"PID {ld['pid']}  {ld.get('served_by', '')}  epoch {ld['epoch']}  batches {ld['batches_yielded']}  "
            f"data stall {100 * ld['data_stall']:.0f}%  deaths {ld['deaths']}  "
            f"restarts {ld['restarts']}  skipped {ld['skipped']}"
            + f"  workers {ld['active_workers']}/{ld['num_workers']}"
            + (" (auto)" if ld["tuned"]["workers"] else "")
            + (f"  prefetch {ld['prefetch_factor']}" if ld["prefetch_factor"] else "")
            + (" (auto)" if ld["tuned"]["prefetch_factor"] else "")
            + f"  {ld['command']}")
        lines.append(f"  {'worker':>6} {'pid':>8} {'samples/s':>10} {'state':>10} {'index':>10} "
                     f"{'at once':>7} "
                     f"{'for s':>6} {'load%':>6} {'coll%':>6} {'enc%':>5} {'idle%':>6} "
                     f"{'RSS MB':>7}")
        for w in ld["workers"]:
            prev = previous.get((ld["pid"], w["id"]))
            secs = w["seconds"]
            total = sum(secs.values()) or 1.0
            if prev is not None and dt > 0:
                rate = (w["samples"] - prev) / dt
            else:  # first look: the average over the worker's life
                rate = w["samples"] / total
            idx = "-" if w["index"] is None else str(w["index"])
            at_once = str(w["in_flight"]) if w["in_flight"] else "-"
            lines.append(
                f"  {w['id']:>6} {w['pid']:>8} {rate:>10.0f} {w['state']:>10} {idx:>10} "
                f"{at_once:>7} "
                f"{w['state_seconds']:>6.1f} {100 * secs['loading'] / total:>6.0f} "
                f"{100 * secs['collating'] / total:>6.0f} {100 * secs['encoding'] / total:>5.0f} "
                f"{100 * secs['idle'] / total:>6.0f} {_mb(w['rss_bytes'])}")
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="stoker top", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pid", nargs="?", type=int, help="show only this main process's loaders")
    ap.add_argument("--once", action="store_true", help="print one snapshot and exit")
    ap.add_argument("--json", action="store_true", help="machine-readable (with --once)")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    args = ap.parse_args(argv)
    if args.once:
        loaders = snapshot()
        if args.pid is not None:
            loaders = [ld for ld in loaders if ld["pid"] == args.pid]
        if args.json:
            print(json.dumps(loaders, indent=1))
        else:
            print(render(loaders, {}, 0.0), end="")
        return 0
    previous: dict = {}
    last = time.monotonic()
    try:
        while True:
            loaders = snapshot()
            now = time.monotonic()
            out = render(loaders, previous, now - last, args.pid)
            previous = {(ld["pid"], w["id"]): w["samples"] for ld in loaders for w in ld["workers"]}
            last = now
            sys.stdout.write("\x1b[H\x1b[2J" + time.strftime("stoker top  %H:%M:%S\n\n") + out)
            sys.stdout.flush()
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0
