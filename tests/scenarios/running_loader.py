"""The loader that ``conftest.start_running_loader`` runs in a process of its own, for tests that
signal it or look at it from outside (stoker top, Ctrl+C, SIGTERM)."""

from __future__ import annotations

import signal


def slow_epoch(context=None):
    """Iterates a slow loader for ever, after printing "PIDS" and its workers' pids."""
    # Ctrl+C as in a terminal. A suite started as a background job of a non-interactive shell
    # (`make test &`) hands its children SIGINT ignored, and Python then installs no
    # KeyboardInterrupt: this process would sit out the test's SIGINT (the cause of the Ctrl+C
    # test's rare timeout). Set before stoker is imported, as the first thing done.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import stoker
    from scenario_datasets import Slow

    loader = stoker.DataLoader(Slow(100_000), batch_size=2, num_workers=2,
                               multiprocessing_context=context)
    it = iter(loader)
    next(it), next(it)  # a batch from each worker: both have started (spawn and forkserver,
    # 3.14's default, import torch first: a Ctrl+C before a worker's first line interrupts it)
    print("PIDS", *[p.pid for p in it._workers], flush=True)
    for _ in it:
        pass
