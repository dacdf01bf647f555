"""Reading memory cgroups, v1 and v2, from a fake /proc and /sys tree."""

from __future__ import annotations

import pytest

from conftest import write_file
from stoker.common import system as _cgroup

pytestmark = pytest.mark.unit  # no process (tests/support/tiers.py)


@pytest.fixture
def fake_tree(cgroup_tree):
    write_file(str(cgroup_tree / "proc" / "vmstat"), "pgfault 10\noom_kill 7\n")
    return cgroup_tree


def test_cgroup_v2_limit_usage_and_oom_kills(fake_tree):
    write_file(str(fake_tree / "proc" / "self" / "cgroup"), "0::/jobs/train\n")
    job = fake_tree / "cg" / "jobs" / "train"
    write_file(str(job / "memory.events"), "low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\n")
    write_file(str(job / "memory.max"), "max\n")
    write_file(str(job / "memory.current"), "536870912\n")
    write_file(str(fake_tree / "cg" / "jobs" / "memory.max"), "1073741824\n")  # the parent limits
    assert _cgroup.memory_cgroup_dir() == (str(job), 2)
    assert _cgroup.oom_kills() == (2, 7)
    assert _cgroup.memory_limit_and_usage() == (1073741824, 536870912)


def test_cgroup_v1_limit_usage_and_oom_kills(fake_tree):
    write_file(str(fake_tree / "proc" / "self" / "cgroup"),
           "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n")
    d = fake_tree / "cg" / "memory" / "docker" / "abc"
    write_file(str(d / "memory.oom_control"), "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n")
    write_file(str(d / "memory.limit_in_bytes"), "2147483648\n")
    write_file(str(d / "memory.usage_in_bytes"), "1073741824\n")
    assert _cgroup.memory_cgroup_dir() == (str(d), 1)
    assert _cgroup.oom_kills() == (5, 7)
    assert _cgroup.memory_limit_and_usage() == (2147483648, 1073741824)


def test_no_memory_cgroup(fake_tree):
    write_file(str(fake_tree / "proc" / "self" / "cgroup"), "0::/\n")
    assert _cgroup.memory_cgroup_dir() == (None, 0)
    assert _cgroup.memory_limit_and_usage() == (None, None)
    assert _cgroup.oom_kills() == (None, 7)
