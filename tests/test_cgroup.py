"""Reading memory cgroups, v1 and v2, from a fake /proc and /sys tree."""

from __future__ import annotations

import os

import pytest

from stoker import _cgroup


def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


@pytest.fixture
def fake_tree(tmp_path, monkeypatch):
    monkeypatch.setattr(_cgroup, "_PROC", str(tmp_path / "proc"))
    monkeypatch.setattr(_cgroup, "_V2_ROOT", str(tmp_path / "cg"))
    monkeypatch.setattr(_cgroup, "_V1_ROOT", str(tmp_path / "cg" / "memory"))
    _write(str(tmp_path / "proc" / "vmstat"), "pgfault 10\noom_kill 7\n")
    return tmp_path


def test_cgroup_v2_limit_usage_and_oom_kills(fake_tree):
    _write(str(fake_tree / "proc" / "self" / "cgroup"), "0::/jobs/train\n")
    job = fake_tree / "cg" / "jobs" / "train"
    _write(str(job / "memory.events"), "low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\n")
    _write(str(job / "memory.max"), "max\n")
    _write(str(job / "memory.current"), "536870912\n")
    _write(str(fake_tree / "cg" / "jobs" / "memory.max"), "1073741824\n")  # the parent limits
    assert _cgroup.memory_cgroup_dir() == (str(job), 2)
    assert _cgroup.oom_kills() == (2, 7)
    assert _cgroup.memory_limit_and_usage() == (1073741824, 536870912)


def test_cgroup_v1_limit_usage_and_oom_kills(fake_tree):
    _write(str(fake_tree / "proc" / "self" / "cgroup"),
           "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n")
    d = fake_tree / "cg" / "memory" / "docker" / "abc"
    _write(str(d / "memory.oom_control"), "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n")
    _write(str(d / "memory.limit_in_bytes"), "2147483648\n")
    _write(str(d / "memory.usage_in_bytes"), "1073741824\n")
    assert _cgroup.memory_cgroup_dir() == (str(d), 1)
    assert _cgroup.oom_kills() == (5, 7)
    assert _cgroup.memory_limit_and_usage() == (2147483648, 1073741824)


def test_no_memory_cgroup(fake_tree):
    _write(str(fake_tree / "proc" / "self" / "cgroup"), "0::/\n")
    assert _cgroup.memory_cgroup_dir() == (None, 0)
    assert _cgroup.memory_limit_and_usage() == (None, None)
    assert _cgroup.oom_kills() == (None, 7)
