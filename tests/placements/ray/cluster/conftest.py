"""A real Ray cluster on loopback for the Ray placement's tests: a head and a second node, each
1 CPU, started by `ray start` in private temp dirs, never a mock.

These tests run only inside a private network namespace whose one interface is loopback
(tests/placements/ray/test_ray.py starts them with `unshare --net --pid --fork --mount-proc`): Ray 2.60
replaces --node-ip-address 127.0.0.1 with the machine's routable address, so nothing else keeps
its bytes on 127.0.0.1, and the kernel ends every Ray daemon with the namespace. Never `ray
stop` (it kills by name, machine wide): each node's processes are found by its own temp dir.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time

import pytest

BIN = os.path.dirname(sys.executable)
# one token for the whole test cluster (Ray 2.60 authenticates its nodes and drivers): this
# process, the nodes, and the drivers the tests start inherit it
os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(16))
os.environ["RAY_AUTH_MODE"] = "token"
ENV = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
PORT = 6399
ADDRESS = f"127.0.0.1:{PORT}"


class Node:
    def __init__(self, cpus: int, head: bool = False):
        # under the folder tests/placements/ray/test_ray.py made (and removes once the namespace, and with it
        # every Ray daemon writing here, has ended), so no run leaves a temp folder behind
        self.temp = tempfile.mkdtemp(prefix="n", dir=os.environ.get("STOKER_RAY_TEMP"))
        cmd = [os.path.join(BIN, "ray"), "start", "--num-cpus", str(cpus), "--node-ip-address",
               "127.0.0.1", "--temp-dir", self.temp, "--disable-usage-stats"]
        if head:
            cmd += ["--head", "--port", str(PORT), "--include-dashboard", "false"]
        else:
            cmd += ["--address", ADDRESS]
        r = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr

    def pids(self) -> list[int]:
        """This node's processes: its daemons (they name its temp dir) and their children (the
        actors' worker processes)."""
        parent, named = {}, set()
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().decode(errors="replace")
                with open(f"/proc/{pid}/stat") as f:
                    parent[int(pid)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if self.temp in cmd:
                named.add(int(pid))
        out, changed = set(named), True
        while changed:
            changed = False
            for pid, ppid in parent.items():
                if ppid in out and pid not in out:
                    out.add(pid)
                    changed = True
        return sorted(out)

    def kill(self) -> None:
        """The whole node leaves the cluster at once (a machine lost)."""
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _in_namespace() -> bool:
    if os.environ.get("STOKER_RAY_NETNS") != "1":
        return False
    import socket

    return [name for _, name in socket.if_nameindex()] == ["lo"]


@pytest.fixture(scope="session")
def cluster():
    assert _in_namespace(), ("the Ray tests start a cluster: run them through "
                             "tests/placements/ray/test_ray.py, which gives them a loopback-only namespace")
    import ray

    head = Node(1, head=True)
    second = Node(1)
    ray.init(address=ADDRESS, logging_level="error", log_to_driver=False)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and ray.cluster_resources().get("CPU", 0) < 2:
        time.sleep(0.2)
    nodes = [n for n in ray.nodes() if n["Alive"]]
    assert len(nodes) == 2 and all(n["NodeManagerAddress"] == "127.0.0.1" for n in nodes), nodes
    yield {"head": head, "second": second, "ray": ray, "address": ADDRESS}
    ray.shutdown()


def wait_until(cond, timeout=60.0, step=0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return cond()


@pytest.fixture
def clean(cluster):
    """Each test leaves the cluster as it found it: every CPU free again (no actor left)."""
    import gc

    ray = cluster["ray"]
    yield cluster
    gc.collect()  # (a traceback the test kept holds its iterator, as any traceback would)
    total = ray.cluster_resources().get("CPU", 0)
    assert wait_until(lambda: ray.available_resources().get("CPU", 0) >= total, 30), (
        "actors left on the cluster", ray.available_resources(), total)
