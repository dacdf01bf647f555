"""A machine whose CPUs are all taken, on purpose: spinning processes started and killed by the
test (``cpus_taken``), for what must hold on a busy node (issue 50: a worker that computes is
runnable but not running part of the time, and must not read as one that waits).

The burners run at their starter's priority (they inherit its nice value, as the workers of a
loader do), on the CPUs it may use (its affinity, inherited), `per_cpu` to a CPU: a process of
the loader then gets about 1 / (per_cpu + 1) of a CPU, and waits on the run queue for the rest,
whatever else runs on the machine (other processes only take more). That holds only in the
burners' own session: where the kernel groups processes by session (autogroup,
``/proc/sys/kernel/sched_autogroup_enabled``) it shares the CPUs between sessions first, and a
loader in a session of its own (a scenario: ``start_new_session``) would get its session's share
whatever the burners in another one do. So the loader's process starts them (a scenario, in its
own session), not the test.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

from stoker.common.system import usable_cpus

_SPIN = "while True: pass"


@contextlib.contextmanager
def cpus_taken(per_cpu: int = 3):
    """`per_cpu` spinning processes for each CPU this process may use, for the `with` block;
    killed and reaped when it ends (however it ends). Yields their processes."""
    procs: list[subprocess.Popen] = []
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        for _ in range(per_cpu * usable_cpus()):
            procs.append(subprocess.Popen(
                [sys.executable, "-c", _SPIN], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for p in procs:  # (inherited: said, so that a test's change of its own shows here)
            assert os.getpriority(os.PRIO_PROCESS, p.pid) == mine
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
