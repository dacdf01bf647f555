"""The placement seam on its own (placements/base.py, mixed.py): what a placement implements
(eleven methods), what ``Workers`` builds from its reads for every placement (``stats()``,
``seconds_in()``), and ``Mixed`` routing each worker's calls to the placement that owns it. No
processes: a placement here is a table of views."""

from __future__ import annotations

import pytest

from stoker.placements.base import Hung, Workers, WorkerView
from stoker.placements.mixed import Mixed
from stoker.wire.events import EpochBegun

pytestmark = pytest.mark.unit  # no process (tests/support/tiers.py)


def _status(state="loading", loading=1.0, idle=0.5):
    return {"state": state, "state_seconds": 0.1, "index": 7, "position": 0, "task": 3,
            "samples": 10, "batches": 2, "rss_bytes": 1 << 20, "bytes_sent": 4096,
            "seconds_in": {"loading": loading, "collating": 0.0, "encoding": 0.25,
                           "idle": idle}}


class Table(Workers):
    """A placement that only keeps a table: every call is recorded."""

    start_method = "table"

    def __init__(self, num_workers, running, name="t"):
        self.num_workers = num_workers
        self.name = name
        self.views = {w: WorkerView(100 + w, 1.0, 2.0, 0.5, False, _status()) for w in running}
        self.calls = []
        self.events = []

    def start(self, worker_id, config):
        self.calls.append(("start", worker_id))

    def stop(self, worker_id):
        self.calls.append(("stop", worker_id))

    def kill(self, worker_id, hung):
        self.calls.append(("kill", worker_id, hung.seconds))

    def shutdown(self):
        self.calls.append(("shutdown",))

    def send_task(self, worker_id, task, index):
        self.calls.append(("task", worker_id, task, index))
        return True

    def set_memory_share(self, worker_id, nbytes):
        self.calls.append(("share", worker_id, nbytes))
        return True

    def begin_epoch(self, worker_id, epoch, payload):
        self.calls.append(("epoch", worker_id, epoch))
        return True

    def wait(self, timeout_s):
        return self.events.pop(0) if self.events else None

    def view(self, worker_id):
        return self.views.get(worker_id)

    def capture_stack(self, worker_id):
        return f"stack of {self.name}:{worker_id}"

    def slot_usage(self):
        return {"slots": 1, "bytes_held_by_user": 10}

    def where(self, worker_id):
        return {"placement": self.name}


def test_a_placement_implements_at_most_a_dozen_methods():
    assert len(Workers.__abstractmethods__) <= 12, sorted(Workers.__abstractmethods__)
    assert {"view", "capture_stack", "slot_usage", "wait"} <= Workers.__abstractmethods__


def test_stats_and_seconds_are_built_from_the_views():
    t = Table(3, running=[0, 2])
    stats = t.stats()
    assert [e["id"] for e in stats] == [0, 1, 2]
    assert stats[1] == {"id": 1, "pid": None, "alive": False, "placement": "t"}
    e = stats[0]
    assert e["pid"] == 100 and e["alive"] and e["placement"] == "t"
    assert (e["state"], e["index"], e["task"], e["samples"], e["batches"]) == (
        "loading", 7, 3, 10, 2)
    assert e["seconds"] == {"getitem": 1.0, "collate": 0.0, "encode": 0.25, "idle": 0.5}
    assert t.seconds_in() == {"loading": 2.0, "collating": 0.0, "encoding": 0.5, "idle": 1.0}


def test_mixed_routes_each_worker_to_its_placement():
    local, remote = Table(4, running=[0, 1], name="local"), Table(4, running=[2, 3], name="ray")
    m = Mixed(local, remote, split=2)
    m.start(1, None)
    m.send_task(3, 9, [1, 2])
    m.kill(2, Hung(None, 4.0, ""))
    m.set_memory_share(0, 123)
    m.begin_epoch(3, 5, b"")
    assert local.calls == [("start", 1), ("share", 0, 123)]
    assert remote.calls == [("task", 3, 9, [1, 2]), ("kill", 2, 4.0), ("epoch", 3, 5)]
    assert m.view(0).pid == 100 and m.view(3).pid == 103 and m.capture_stack(2) == "stack of ray:2"
    assert [e["placement"] for e in m.stats()] == ["local", "local", "ray", "ray"]
    assert m.slot_usage() == {"slots": 2, "bytes_held_by_user": 20}
    assert m.seconds_in()["loading"] == 4.0
    m.start_all(4, None)
    assert local.calls[-2:] == [("start", 0), ("start", 1)]
    assert remote.calls[-2:] == [("start", 2), ("start", 3)]
    m.shutdown()
    assert local.calls[-1] == remote.calls[-1] == ("shutdown",)


def test_mixed_waits_on_both_and_returns_none_after_its_timeout():
    local, remote = Table(2, running=[0]), Table(2, running=[1])
    m = Mixed(local, remote, split=1)
    ev = EpochBegun(1, 4)
    remote.events.append(ev)
    assert m.wait(1.0) is ev
    assert m.wait(0.05) is None


def test_the_run_queue_is_the_views_unless_a_placement_reads_it():
    t = Table(3, running=[0, 1, 2])
    assert t.runqueue_of(0) is None and t.runqueue_seconds() is None  # (no view knows it)
    t.views[1] = WorkerView(101, 1.0, 2.0, 0.5, False, _status(), 1.5)  # (a Ray actor's report)
    t.views[2] = WorkerView(102, 1.0, 2.0, 0.5, False, _status(), 0.25)
    assert t.runqueue_of(1) == 1.5 and t.runqueue_of(5) is None
    assert t.runqueue_seconds() == 1.75  # the known ones added up
    # with the view's CPU, where the view has a run queue (a Ray actor's report)
    assert t.schedstat_of(1) == (0.5, 1.5) and t.schedstat_of(0) is None
    # a placement that reads the kernel itself (the local one) gives both: runqueue_of follows
    t.schedstat_of = lambda w: (0.125, 0.75)
    assert t.runqueue_of(0) == 0.75 and t.runqueue_seconds() == 2.25


def test_mixed_routes_the_run_queue_and_takes_the_smaller_cpu_share(monkeypatch):
    from stoker.placements import base

    local, remote = Table(4, running=[0, 1], name="local"), Table(4, running=[2, 3], name="ray")
    remote.views[3] = WorkerView(103, 1.0, 2.0, 0.5, False, _status(), 2.0)
    local.views[0] = WorkerView(100, 1.0, 2.0, 0.5, False, _status(), 0.5)
    m = Mixed(local, remote, split=2)
    assert (m.runqueue_of(3), m.runqueue_of(0), m.runqueue_of(2)) == (2.0, 0.5, None)
    assert m.runqueue_seconds() == 2.5
    local.schedstat_of = lambda w: (9.0, 0.5)  # (the local placement reads the kernel)
    assert (m.schedstat_of(3), m.schedstat_of(0), m.schedstat_of(2)) == ((0.5, 2.0), (9.0, 0.5),
                                                                          None)
    monkeypatch.setattr(base._system, "rank_cpus", lambda: 16)
    remote.cpus_per_worker = lambda: 2
    assert local.cpus_per_worker() == 4 and m.cpus_per_worker() == 2


def test_each_worker_takes_its_share_of_the_cpus_this_process_may_use(monkeypatch):
    from stoker.placements import base

    monkeypatch.setattr(base._system, "rank_cpus", lambda: 16)
    assert [Table(n, running=[]).cpus_per_worker() for n in (1, 2, 3, 16, 32, 0)] == [
        16, 8, 5, 1, 1, 16]


def test_ray_actors_take_what_each_asked_of_the_cluster():
    from stoker.placements.ray.workers import RayWorkers

    ray = RayWorkers.__new__(RayWorkers)  # (no cluster: only its spec is read)
    for asked, share in ((1.0, 1), (4.0, 4), (2.5, 2), (0.5, 1)):
        ray._spec = type("Spec", (), {"cpus_per_worker": asked})()
        assert ray.cpus_per_worker() == share


def test_the_node_pool_gives_its_workers_their_share_not_the_rank(monkeypatch):
    from stoker.placements.node import budget
    from stoker.placements.node.workers import NodeWorkers

    # every rank says 1 (its hello's key must not differ by rank): the pool sets the share
    assert NodeWorkers.cpus_per_worker(NodeWorkers.__new__(NodeWorkers)) == 1
    monkeypatch.setattr(budget._system, "usable_cpus", lambda: 18)
    assert budget.worker_cpus(4, 2) == 4  # 16 CPUs past the ranks' loops, 4 loading at once
    assert budget.worker_cpus(16, 2) == 1 and budget.worker_cpus(40, 2) == 1
    assert budget.worker_cpus(1, 0) == 17  # (at least one loop)
    assert budget.worker_cpus(0, 1) == 17
