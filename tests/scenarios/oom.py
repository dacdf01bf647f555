"""A worker killed by the out-of-memory killer of a memory cgroup is named as such
(tests/loader/iterators/test_oom.py; the test starts this process inside a small memory cgroup)."""

from __future__ import annotations

import stoker
from scenario_datasets import Hog
from scenarios import expect_raises
from scenarios.probes import leftovers


def oom_kill_is_named():
    """A worker the cgroup's OOM killer kills is named so, with its index and what to change.
    Forked workers, which share this process's pages: a spawned one (forkserver, 3.14's default)
    imports torch anew, ~0.3 GB each on 3.14t, and the cgroup's killer would take this process,
    the largest, before the sample that hogs is loaded."""
    loader = stoker.DataLoader(Hog(5, mb=2048, n=16), batch_size=2, num_workers=2,
                               on_worker_death="raise", multiprocessing_context="fork")
    with expect_raises(stoker.WorkerCrashed) as raised:
        list(loader)
    e = raised.value
    msg = str(e)
    assert e.signal == "SIGKILL", e.signal
    assert "out-of-memory killer" in msg and "memory limit" in msg, msg
    assert "dataset index 5" in msg and "lower num_workers" in msg, msg
    assert not leftovers(), leftovers()
