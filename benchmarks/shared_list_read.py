"""Reading items of a stoker.SharedList against a plain list, in one process: a million
three-field records, scanned as the bench's `metadata` workload does (every 64th item, 64
passes), best of 3; nanoseconds an item (the loop's own cost included: it is the same for both).

    .venv/bin/python benchmarks/shared_list_read.py [--items 1000000]
"""

from __future__ import annotations

import argparse
import time

import stoker


def scan(items, start: int) -> int:
    total = 0
    for k in range(start, len(items), 64):
        total += items[k]["size"]
    return total


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--items", type=int, default=1_000_000)
    a = p.parse_args()
    records = [{"path": f"/data/train/{k:07d}.jpg", "label": k % 1000, "size": 1000 + k % 977}
               for k in range(a.items)]
    shared = stoker.SharedList(records)
    for name, items in (("list of dicts", records), ("stoker.SharedList", shared)):
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for start in range(64):
                scan(items, start)
            best = min(best, time.perf_counter() - t0)
        print(f"{name}: {best / len(items) * 1e9:.0f} ns an item")
    print(f"SharedList: {shared.nbytes / 2**20:.0f} MB for {len(shared):,} items")


if __name__ == "__main__":
    main()
