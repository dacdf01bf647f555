"""A worker killed by the out-of-memory killer of a memory cgroup is named as such.

The scenario runs in a fresh interpreter, in the cgroup: tests/scenarios/oom.py."""

from __future__ import annotations

import os
import uuid

import pytest

from support.scenarios import run_ok


def _make_memory_cgroup(limit_bytes: int):
    """A child memory cgroup of ours with a limit: (directory, procs file), or a skip reason."""
    text = open("/proc/self/cgroup").read()
    name = f"stoker-oom-test-{uuid.uuid4().hex[:8]}"
    for line in text.splitlines():
        hid, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):  # cgroup v1
            d = os.path.join("/sys/fs/cgroup/memory", path.lstrip("/"), name)
            try:
                os.mkdir(d)
                with open(os.path.join(d, "memory.limit_in_bytes"), "w") as f:
                    f.write(str(limit_bytes))
                return d, None
            except OSError as e:
                return None, f"cannot create a v1 memory cgroup: {e}"
    for line in text.splitlines():
        hid, controllers, path = line.split(":", 2)
        if hid == "0":  # cgroup v2
            parent = os.path.join("/sys/fs/cgroup", path.lstrip("/"))
            d = os.path.join(parent, name)
            try:
                os.mkdir(d)
                with open(os.path.join(d, "memory.max"), "w") as f:
                    f.write(str(limit_bytes))
                with open(os.path.join(d, "memory.swap.max"), "w") as f:
                    f.write("0")
                return d, None
            except OSError as e:
                return None, f"cannot create a v2 memory cgroup with a limit: {e}"
    return None, "no memory cgroup controller is mounted"


def test_oom_kill_in_a_memory_cgroup_is_named():
    d, why = _make_memory_cgroup(900 * 2**20)
    if d is None:
        pytest.skip(why)
    try:
        wrapper = ["sh", "-c", f'echo $$ > {d}/cgroup.procs && exec "$@"', "sh"]
        run_ok("oom.oom_kill_is_named", timeout=120, wrapper=wrapper)
    finally:
        try:
            os.rmdir(d)
        except OSError:
            pass
