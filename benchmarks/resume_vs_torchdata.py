"""Checkpoint and resume, stoker against torchdata's StatefulDataLoader, on the failures users
report about mid-epoch resume.

Each scenario builds the same shuffled loader (40 samples, batches of 4, a seeded generator),
interrupts it as described, resumes from ``state_dict()`` in a new loader, and compares what the
two runs delivered with one uninterrupted run: "exact" when the batches (indices, and values
where the scenario says so) are the uninterrupted run's, else how many samples were repeated or
lost, or the error. It also times a resume deep into a large epoch (load_state_dict to the first
batch). torchdata is optional: without it the script says so and reports stoker alone
(``make bench`` installs it). Run: ``.venv/bin/python benchmarks/resume_vs_torchdata.py
[--markdown]``.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import stoker  # noqa: E402
from resume_datasets import Augmented, as_lists  # noqa: E402

N, B = 40, 4


def loader_kinds():
    kinds = {"stoker": lambda ds, **kw: stoker.DataLoader(ds, seed="per_sample", **kw)}
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError as e:
        print(f"torchdata is not installed ({e}); reporting stoker alone. `make bench` installs "
              "it (pip install --no-deps torchdata).", file=sys.stderr)
    else:
        kinds["torchdata StatefulDataLoader"] = StatefulDataLoader
    return kinds


def build(cls, workers=0, persistent=False, n=N, batch_size=B, drop_last=False):
    kw = {"prefetch_factor": 4, "persistent_workers": persistent} if workers else {}
    return cls(Augmented(n), batch_size=batch_size, shuffle=True, num_workers=workers,
               generator=torch.Generator().manual_seed(1), drop_last=drop_last, **kw)


def run_resumes(cls, cuts, workers):
    """Iterates epoch 1, stops after each number of batches in `cuts` (a new loader each time,
    resumed from the last state, under the matching entry of `workers`), then runs to the end
    of epoch 2. Returns the batches of both epochs."""
    got, sd = [], None
    for k, w in zip(cuts, workers):
        loader = build(cls, w)
        if sd is not None:
            loader.load_state_dict(sd)
        it = iter(loader)
        got += as_lists(next(it) for _ in range(k))
        sd = loader.state_dict()
        del it
    loader = build(cls, workers[-1])
    loader.load_state_dict(sd)
    got += as_lists(loader)
    got += as_lists(loader)
    return got


def iter_before_load(cls):
    first = build(cls, 2)
    it = iter(first)
    got = as_lists(next(it) for _ in range(5))
    sd = first.state_dict()
    del it
    loader = build(cls, 2)
    it = iter(loader)
    loader.load_state_dict(sd)
    got += as_lists(it)
    got += as_lists(loader)
    return got


def end_of_epoch(cls):
    first = build(cls, 2)
    it = iter(first)
    got = as_lists(next(it) for _ in range(N // B))  # the last batch; the loop has not ended
    sd = first.state_dict()
    del it
    loader = build(cls, 2)
    loader.load_state_dict(sd)
    got += as_lists(loader)  # the rest of epoch 1: nothing
    got += as_lists(loader)
    return got


def other_batch_size(cls, drop_last, k=3, new=6):
    """Batches of 4 (2 workers), stopped after `k`; resumed with batches of `new`."""
    first = build(cls, 2, drop_last=drop_last)
    it = iter(first)
    got = as_lists(next(it) for _ in range(k))
    sd = first.state_dict()
    del it
    loader = build(cls, 2, batch_size=new, drop_last=drop_last)
    loader.load_state_dict(sd)
    got += as_lists(loader)  # the rest of epoch 1, in batches of `new`
    got += as_lists(loader)  # epoch 2, the new loader's own
    return got


def other_batch_size_reference(cls, drop_last, k=3, new=6):
    """The saved epoch's order (an uninterrupted run's, 2 workers), its rest cut into batches
    of `new` (the last short, or dropped under drop_last), then an uninterrupted run's epoch 2
    with batches of `new`."""
    whole = as_lists(build(cls, 2))
    order = [[i for b in whole for i in b[n]] for n in range(len(whole[0]))]
    out = whole[:k]
    rest = [col[k * B:] for col in order]
    for at in range(0, len(rest[0]), new):
        if not drop_last or at + new <= len(rest[0]):
            out.append([col[at:at + new] for col in rest])
    fresh = build(cls, 2, batch_size=new, drop_last=drop_last)
    as_lists(fresh)
    return out + as_lists(fresh)


def same_values_any_workers(cls):
    return as_lists(build(cls, 0)) + as_lists(build(cls, 3))


SCENARIOS = [
    ("two resumes in one epoch (2 workers)", lambda c: run_resumes(c, [3, 3], [2, 2]), False),
    ("three resumes in one epoch (2 workers)", lambda c: run_resumes(c, [2, 2, 3], [2, 2, 2]),
     False),
    ("state_dict() right after a resume", lambda c: run_resumes(c, [4, 0], [2, 2]), False),
    ("iter() before load_state_dict", iter_before_load, False),
    ("resume at the end of an epoch", end_of_epoch, False),
    ("prefetched batches (prefetch_factor=4), resume 2 -> 2 workers",
     lambda c: run_resumes(c, [1], [2]), False),
    ("resume 2 -> 0 workers", lambda c: run_resumes(c, [3], [0]), False),
    ("resume 0 -> 3 workers", lambda c: run_resumes(c, [3], [3]), False),
    ("augmentation values equal, 0 vs 3 workers", same_values_any_workers, True),
    ("augmentation values equal after a 2 -> 3 workers resume",
     lambda c: run_resumes(c, [3], [3]), True),
    ("resume 4 -> 6 batch size (2 workers)", lambda c: other_batch_size(c, False), False),
    ("resume 4 -> 6 batch size, drop_last=True (2 workers)",
     lambda c: other_batch_size(c, True), False),
]
REFERENCES = {"resume 4 -> 6 batch size (2 workers)":
              lambda c: other_batch_size_reference(c, False),
              "resume 4 -> 6 batch size, drop_last=True (2 workers)":
              lambda c: other_batch_size_reference(c, True)}


def verdict(got, ref, values: bool) -> str:
    if values:
        same = got == ref
        return "exact" if same else "values differ"
    ids = [b[0] for b in got]
    want = [b[0] for b in ref]
    if ids == want:
        return "exact"
    flat = collections.Counter(i for b in ids for i in b)
    expected = collections.Counter(i for b in want for i in b)
    repeated = sum((flat - expected).values())
    lost = sum((expected - flat).values())
    return f"wrong: {repeated} repeated, {lost} lost" if repeated or lost else "other order"


def reference(cls, scenario):
    if scenario is same_values_any_workers:
        one = as_lists(build(cls, 0))
        return one + one
    loader = build(cls, 0)
    return as_lists(loader) + as_lists(loader)


def resume_time(cls, n=200_000, at=4000, workers=2):
    """Seconds from load_state_dict to the first batch, resuming at batch `at` of `n // B`."""
    loader = build(cls, workers, n=n)
    it = iter(loader)
    for _ in range(at):
        next(it)
    sd = loader.state_dict()
    del it
    fresh = build(cls, workers, n=n)
    t = time.perf_counter()
    fresh.load_state_dict(sd)
    next(iter(fresh))
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    kinds = loader_kinds()
    rows = []
    for name, fn, values in SCENARIOS:
        row = [name]
        for cls in kinds.values():
            try:
                ref = REFERENCES[name](cls) if name in REFERENCES else reference(cls, fn)
                row.append(verdict(fn(cls), ref, values))
            except Exception as e:
                row.append(f"{type(e).__name__}: {str(e).splitlines()[0][:100]}")
        rows.append(row)
    row = ["resume at batch 4000 of 50000 (2 workers): load_state_dict to first batch"]
    for cls in kinds.values():
        try:
            row.append(f"{resume_time(cls):.2f} s")
        except Exception as e:
            row.append(f"{type(e).__name__}: {str(e).splitlines()[0][:100]}")
    rows.append(row)
    head = ["scenario", *kinds]
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        for r in [head, *rows]:
            print(" | ".join(r))


if __name__ == "__main__":
    main()
