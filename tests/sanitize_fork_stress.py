"""Reproduces the hang `make sanitize-extension` met once in eight CI runs, in seconds: under
ASan (run it as tests/sanitize_extension.sh runs pytest: the instrumented package first on
PYTHONPATH, libasan and libubsan in LD_PRELOAD), torch's loader and stoker's, 2 workers each,
2 epochs each, one after the other, for SECONDS: `sanitize_fork_stress.py SECONDS`.

Each stoker epoch forks its workers just after torch's iterator was torn down, while threads
of it (its queues' feeder threads) end. A thread ending frees its memory with no GIL; GCC 12's
libasan takes its allocator's region lock for that and, having no fork handler, lets a fork in
the meantime copy the lock held into the child, which then waits on it at its first malloc.
Here it happened within 30 s. When an epoch stalls for 60 s this prints, for every process of
its session, the waits made from inside libasan (tests/sanitize_watch.py) and the stacks
(py-spy), and exits 3; 0 when none stalled.
"""

import os
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import compat_datasets as cd  # noqa: E402
import sanitize_watch  # noqa: E402
import stoker  # noqa: E402

progress = [time.monotonic()]


def watch() -> None:
    while True:
        time.sleep(5)
        if time.monotonic() - progress[0] > 60:
            print("an epoch stalled for 60 s; the processes:", flush=True)
            for p in sanitize_watch.session_pids(os.getsid(0)):
                print(p, sanitize_watch.waits_in_libasan(p), flush=True)
                print(sanitize_watch.describe(p), flush=True)
            os._exit(3)


def main() -> int:
    threading.Thread(target=watch, daemon=True, name="stall-watch").start()
    end = time.monotonic() + float(sys.argv[1])
    rounds = 0
    while time.monotonic() < end:
        for cls in (torch.utils.data.DataLoader, stoker.DataLoader):
            loader = cls(cd.RandomAugDataset(), batch_size=2, shuffle=True, num_workers=2,
                         generator=torch.Generator().manual_seed(2024))
            for _ in range(2):
                for _ in loader:
                    pass
                progress[0] = time.monotonic()
        rounds += 1
    print(f"{rounds} rounds, no stall", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
