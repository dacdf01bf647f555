"""An unchanged training program, not a scenario: tests/loader/integrations/test_enable.py copies it into a folder of
its own and runs it under ``stoker run``, as a script and as a module (``-m train_unchanged``).
Its loaders, and the one of a child it spawns, must be served by stoker."""

from __future__ import annotations

import multiprocessing as mp
import sys

from torch.utils.data import DataLoader

import stoker
from scenarios.enable import Squares


def served(q):
    """In the spawned child: its loader's samples and who served it."""
    dl = DataLoader(Squares(), batch_size=2, num_workers=1)
    q.put((sum(len(b) for b in dl), stoker.stats(dl)["served_by"]))


def main():
    """Prints its arguments, a spawn loader's samples and server, and its child's."""
    print("ARGS", sys.argv[1:])
    dl = DataLoader(Squares(), batch_size=2, num_workers=2, multiprocessing_context="spawn")
    print("MAIN", sum(len(b) for b in dl), stoker.stats(dl)["served_by"])
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=served, args=(q,))
    p.start()
    print("CHILD", *q.get(timeout=120))
    p.join()


if __name__ == "__main__":
    main()
