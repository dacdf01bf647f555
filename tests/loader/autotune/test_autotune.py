"""num_workers="auto": the bound from usable CPUs, the tuner's decisions on synthetic
measurements, and a live loader whose count of active workers changes without changing which
samples come, their order or (per-sample seeding) their values."""

from __future__ import annotations

import itertools
import os
import time

import pytest
import torch

import stoker
from conftest import write_file
from stoker.common import system as _cgroup
from stoker.loader.autotune import measure as _measure
from stoker.loader.autotune import tuner as _autotune
from stoker.loader.autotune import window as _windows
from stoker.placements.base import WorkerView
from support.scenarios import run_ok

GiB = 1 << 30


@pytest.fixture
def fake_tree(cgroup_tree, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    return cgroup_tree


# -- the bound ---------------------------------------------------------------------------------
@pytest.mark.unit
def test_cpu_quota_v2_the_tightest_ancestor_rounded_up(fake_tree):
    write_file(str(fake_tree / "proc" / "self" / "cgroup"), "0::/jobs/train\n")
    write_file(str(fake_tree / "cg" / "jobs" / "train" / "cpu.max"), "max 100000\n")
    write_file(str(fake_tree / "cg" / "jobs" / "cpu.max"), "250000 100000\n")
    assert _cgroup.cpu_quota() == 2.5
    assert _cgroup.usable_cpus() == 3  # affinity 8, quota 2.5


@pytest.mark.unit
def test_cpu_quota_v1(fake_tree):
    write_file(str(fake_tree / "proc" / "self" / "cgroup"), "3:cpu,cpuacct:/docker/abc\n")
    d = fake_tree / "cg" / "cpu,cpuacct" / "docker" / "abc"
    write_file(str(d / "cpu.cfs_quota_us"), "150000\n")
    write_file(str(d / "cpu.cfs_period_us"), "100000\n")
    assert _cgroup.cpu_quota() == 1.5
    assert _cgroup.usable_cpus() == 2


@pytest.mark.unit
def test_no_quota_the_affinity_and_a_tiny_quota_still_one(fake_tree):
    write_file(str(fake_tree / "proc" / "self" / "cgroup"), "0::/\n")
    write_file(str(fake_tree / "cg" / "cpu.max"), "max 100000\n")
    assert _cgroup.cpu_quota() is None
    assert _cgroup.usable_cpus() == 8
    write_file(str(fake_tree / "cg" / "cpu.max"), "10000 100000\n")  # a tenth of a CPU
    assert _cgroup.usable_cpus() == 1


_LAUNCHERS = ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
              "SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE", "SLURM_NODEID")


@pytest.fixture
def ranks_tree(fake_tree, monkeypatch):
    """The fake tree of a 16-CPU machine, with no launcher's variables."""
    for name in _LAUNCHERS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    write_file(str(fake_tree / "proc" / "self" / "cgroup"), "0::/job\n")
    return fake_tree


@pytest.mark.unit
def test_cpu_lists_are_counted():
    assert _cgroup.cpu_list_count("0-3,8,10-11\n") == 7
    assert _cgroup.cpu_list_count("5") == 1
    assert _cgroup.cpu_list_count("") is None
    assert _cgroup.cpu_list_count("0-x") is None


@pytest.mark.unit
def test_the_launchers_say_how_many_ranks_share_this_machine(ranks_tree, monkeypatch):
    assert _cgroup.local_ranks() == 1
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", "4(x2)")
    assert _cgroup.local_ranks() == 1  # an allocation's batch script, not a step's task
    monkeypatch.setenv("SLURM_LOCALID", "0")
    assert _cgroup.local_ranks() == 4
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", "3(x2),1")
    monkeypatch.setenv("SLURM_NODEID", "2")
    assert _cgroup.local_ranks() == 1
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "6")
    assert _cgroup.local_ranks() == 6
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")  # torchrun's comes first
    assert _cgroup.local_ranks() == 8
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "zero")
    assert _cgroup.local_ranks() == 6


@pytest.mark.unit
def test_a_rank_takes_its_share_of_the_machine(ranks_tree, monkeypatch):
    cg = ranks_tree / "cg"
    # alone: every CPU it may use (affinity 8)
    assert _cgroup.rank_cpus() == _cgroup.usable_cpus() == 8
    # 4 ranks sharing the machine's 16 CPUs, each allowed all 8 of its mask: 4 each
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert _cgroup.node_cpus() == 16
    assert _cgroup.rank_cpus() == 4
    # a container's cpuset of 12 CPUs (an ancestor's, the job's own cgroup has none)
    write_file(str(cg / "cpuset.cpus.effective"), "0-11\n")
    assert _cgroup.node_cpus() == 12 and _cgroup.rank_cpus() == 3
    # each rank bound to 2 cores of its own by its launcher: those 2
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {4, 5})
    assert _cgroup.rank_cpus() == 2
    # the ranks share the container's quota of 6 CPUs
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(12)))
    write_file(str(cg / "job" / "cpu.max"), "600000 100000\n")
    assert _cgroup.rank_cpus() == 2
    # more ranks than CPUs: one worker each, not none
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "32")
    assert _cgroup.rank_cpus() == 1


def test_four_ranks_under_auto_start_their_share_of_the_machine_between_them(tmp_path):
    """Four real ranks of one job (LOCAL_WORLD_SIZE=4), each a loader with num_workers="auto":
    between them they start no more workers than the machine has CPUs (one each at least),
    where each used to start half the machine and climb to all of it."""
    import json
    import signal
    import subprocess

    from support.scenarios import HERE, completed, expect_ok, scenario_command, scenario_env

    env = {k: v for k, v in scenario_env().items() if k not in _LAUNCHERS}
    env.update(LOCAL_WORLD_SIZE="4", WORLD_SIZE="4")
    procs = [subprocess.Popen(
        scenario_command("autotune.a_rank_under_auto", str(tmp_path / f"rank{r}")), cwd=HERE,
        env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True)
        for r in range(4)]
    try:
        for p in procs:
            expect_ok(completed(p, *p.communicate(timeout=120)))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    reps = [json.loads((tmp_path / f"rank{r}").read_text()) for r in range(4)]
    cpus = _cgroup.node_cpus()
    assert all(r["started"] <= r["num_workers"] == r["rank_cpus"] for r in reps), reps
    assert all(r["num_workers"] == max(1, min(r["usable_cpus"], cpus // 4)) for r in reps), reps
    assert sum(r["started"] for r in reps) <= max(4, cpus), reps


@pytest.mark.unit
def test_auto_resolves_within_one_and_usable_cpus():
    class DS(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return i

    dl = stoker.DataLoader(DS(), num_workers="auto")
    assert 1 <= dl.num_workers <= len(os.sched_getaffinity(0))
    assert dl.num_workers == _cgroup.rank_cpus()
    assert dl.autotune is True
    assert stoker.DataLoader(DS(), num_workers=2).autotune is False


# -- the tuner, on synthetic measurements ----------------------------------------------------------
def _window(stall=0.0, busy=0.0, main_cpu=1.0, worker_cpu=0.0, cpus=8, rss=100 << 20,
            headroom=None, limit=None):
    return _windows.Window(seconds=1.0, waited_s=stall, main_cpu_s=main_cpu,
                            worker_cpu_s=worker_cpu, worker_busy_s=busy, usable_cpus=cpus,
                            worker_rss=rss, slot_bytes_per_worker=0, memory_headroom=headroom,
                            memory_limit=limit)


def _run(tuner, windows):
    return [tuner.decide(w, batch) for batch, w in enumerate(windows)]


@pytest.mark.unit
def test_a_stalled_loop_with_free_cores_gains_workers_up_to_the_bound():
    t = _autotune.Tuner(bound=4, initial=1)
    counts = _run(t, [_window(stall=0.6, busy=t_busy, worker_cpu=t_busy)
                      for t_busy in (1.0,) * 10])
    # one more every other window (the window after a change is not judged), never past 4
    assert counts == [2, 2, 3, 3, 4, 4, 4, 4, 4, 4]
    assert "waited for data 60%" in t.reason
    assert [d.active for d in t.decisions] == [1, 2, 3, 4]


@pytest.mark.unit
def test_no_worker_added_without_a_free_core():
    t = _autotune.Tuner(bound=8, initial=3)
    # the main process takes 2 cores, 3 workers take 3: 0.5 of 4 CPUs left
    counts = _run(t, [_window(stall=0.5, main_cpu=2.0, worker_cpu=1.5, cpus=4)] * 5)
    assert counts == [3] * 5


@pytest.mark.unit
def test_memory_budget_is_respected():
    t = _autotune.Tuner(bound=8, initial=2)
    # 3 GiB of headroom under a 8 GiB limit, 2.5 GiB per worker: one more would leave 0.5 GiB,
    # under the 10% margin
    w = _window(stall=0.9, rss=int(2.5 * GiB), headroom=3 * GiB, limit=8 * GiB)
    assert _run(t, [w] * 4) == [2] * 4
    assert "memory limit" in t.reason and "not adding" in t.reason
    # with room for it, the same stall adds one
    assert t.decide(_window(stall=0.9, rss=int(2.5 * GiB), headroom=6 * GiB, limit=8 * GiB),
                    9) == 3


@pytest.mark.unit
def test_idle_workers_are_retired_after_two_quiet_windows_and_not_when_busy():
    t = _autotune.Tuner(bound=8, initial=6)
    # no stall, 6 workers busy 2 worker-seconds per second: 5 suffice (0.4 each)
    assert _run(t, [_window(stall=0.0, busy=2.0)] * 3) == [6, 5, 5]
    assert "5 suffice" in t.reason
    busy = _autotune.Tuner(bound=8, initial=4)
    # 4 workers busy 3.5 worker-seconds per second: 3 would be over RETIRE_FIT each
    assert _run(busy, [_window(stall=0.0, busy=3.5)] * 6) == [4] * 6
    one = _autotune.Tuner(bound=8, initial=1)
    assert _run(one, [_window(stall=0.0, busy=0.0)] * 4) == [1] * 4


# -- the first look -------------------------------------------------------------------------------
def _costs(per_batch_busy, per_batch_cpu, own, main_cpu=None, cpus=16, batches=100, seconds=1.0):
    """A first window of `batches` batches: each takes a worker `per_batch_busy` s (of which
    `per_batch_cpu` on a CPU) and the loop `own` s of its own; the rest it waited."""
    main_cpu = own if main_cpu is None else main_cpu
    return _windows.Window(
        seconds=seconds, waited_s=seconds - own * batches, main_cpu_s=main_cpu * batches,
        worker_cpu_s=per_batch_cpu * batches, worker_busy_s=per_batch_busy * batches,
        usable_cpus=cpus, worker_rss=100 << 20, slot_bytes_per_worker=0, memory_headroom=None,
        memory_limit=None, workers=1, batches=batches, first=True)


@pytest.mark.unit
def test_needed_keeps_up_with_the_loop_within_the_cpus():
    # 10 ms of CPU a batch in a worker, 1 ms in the loop: 10 workers keep up, 16 CPUs fit them
    assert _windows.needed(_costs(0.010, 0.010, 0.001)) == 10
    # a loop that takes 5 ms a batch needs 2 such workers
    assert _windows.needed(_costs(0.010, 0.010, 0.005, batches=100)) == 2
    # 4 CPUs: 11 ms of CPU a batch allows 364 batches/s, which 4 workers make
    assert _windows.needed(_costs(0.010, 0.010, 0.001, cpus=4)) == 4
    # workers waiting on I/O (1 ms of CPU in 10 ms): as many as keep up, never more than CPUs
    assert _windows.needed(_costs(0.010, 0.001, 0.001, cpus=4)) == 4
    assert _windows.needed(_costs(0.010, 0.001, 0.004, cpus=16)) == 3


@pytest.mark.unit
def test_the_first_look_goes_straight_to_the_count_needed():
    t = _autotune.Tuner(bound=16, initial=8)
    assert t.decide(_costs(0.010, 0.010, 0.001), 5) == 10
    assert "8 -> 10 workers at the first look" in t.reason
    # later windows go one at a time again (the one after a change is not judged)
    assert _run(t, [_window(stall=0.6, busy=1.0, worker_cpu=1.0, cpus=16)] * 3) == [10, 11, 11]
    # no wait at the first look: nothing to add
    calm = _autotune.Tuner(bound=16, initial=8)
    assert calm.decide(_costs(0.010, 0.010, 0.009), 5) == 8
    # the memory limit holds one more worker only
    short = _autotune.Tuner(bound=16, initial=8)
    w = _costs(0.010, 0.010, 0.001)
    w.memory_limit, w.memory_headroom = 8 * GiB, int(0.8 * GiB) + (150 << 20)
    assert short.decide(w, 5) == 9


@pytest.mark.unit
def test_a_fresh_loader_starts_two_workers_at_least_and_leaves_the_loop_a_cpu():
    assert _autotune.Tuner(bound=2).active == 1  # (the training loop keeps a CPU)
    assert _autotune.Tuner(bound=3).active == 2
    assert _autotune.Tuner(bound=4).active == 2
    assert _autotune.Tuner(bound=16).active == 8
    assert _autotune.Tuner(bound=1).active == 1


# -- a live loader -----------------------------------------------------------------------------------
class SlowRandom(torch.utils.data.Dataset):
    """Slow samples whose value is drawn from torch's generator (per-sample seeding fixes it)."""

    def __len__(self):
        return 240

    def __getitem__(self, i):
        time.sleep(0.005)
        return torch.tensor([float(i), torch.rand(()).item()])


def _epoch(dl):
    return torch.cat(list(dl))


def test_a_slow_dataset_gains_workers_and_delivers_every_sample_once_in_order(monkeypatch):
    monkeypatch.setattr(_cgroup, "usable_cpus", lambda: 4)
    dl = stoker.DataLoader(SlowRandom(), batch_size=2, num_workers="auto", seed="per_sample")
    assert dl.num_workers == 4
    torch.manual_seed(7)
    got = _epoch(dl)
    assert got[:, 0].tolist() == list(range(240))
    auto = dl.stats()["autotune"]
    assert auto["max_workers"] == 4
    assert auto["decisions"][0]["active"] == 2
    assert auto["active_workers"] > 2, auto  # the loop waited for data: workers were added
    torch.manual_seed(7)
    fixed = _epoch(stoker.DataLoader(SlowRandom(), batch_size=2, num_workers=2,
                                     seed="per_sample"))
    assert torch.equal(got, fixed)  # the same values, whichever worker loaded them


def test_the_first_look_adds_the_workers_within_a_few_batches(monkeypatch):
    monkeypatch.setattr(_cgroup, "usable_cpus", lambda: 4)
    dl = stoker.DataLoader(SlowRandom(), batch_size=2, num_workers="auto")
    assert sorted(_epoch(dl)[:, 0].tolist()) == list(range(240))
    first = dl.stats()["autotune"]["decisions"][1]
    # the loop waited: 5 ms samples, a loop with nothing to do; 4 CPUs fit 4
    assert first["active"] == 4 and "first look" in first["reason"], first
    assert first["batch"] <= 8, first


@pytest.mark.unit
def test_a_tiny_epoch_still_gets_its_first_look_after_a_window(monkeypatch):
    class Workers:
        def view(self, w):
            return WorkerView(1, 0.0, 0.0, 0.0, False, {
                "seconds_in": {"loading": 0.0, "collating": 0.0, "encoding": 0.0},
                "rss_bytes": 1})

        def schedstat_of(self, w):
            return None

        def slot_usage(self):
            return {}

    class Stats:
        waited_s = 0.0
        yielded = 0

    stats = Stats()
    m = _measure.Measure(stats, Workers(), usable_cpus=2)
    assert not m.due([0])
    stats.yielded = 1
    assert not m.due([0])  # the first look's window starts at the first batch
    stats.yielded = 2
    assert not m.due([0])
    monkeypatch.setattr(_measure, "WINDOW_S", 0.0)
    assert m.due([0])  # 2 batches only, but a window's time has passed
    w = m.window([0])
    assert w.first and w.batches == 1


def test_the_next_loader_of_a_dataset_starts_where_the_last_one_ended(monkeypatch):
    monkeypatch.setattr(_cgroup, "usable_cpus", lambda: 4)
    ds = SlowRandom()
    a = stoker.DataLoader(ds, batch_size=2, num_workers="auto")
    list(a)
    learnt = a.stats()["autotune"]["active_workers"]
    b = stoker.DataLoader(ds, batch_size=2, num_workers="auto")
    list(b)
    start = b.stats()["autotune"]["decisions"][0]
    assert start["active"] == learnt and "last loader of this dataset" in start["reason"], start
    c = stoker.DataLoader(SlowRandom(), batch_size=2, num_workers="auto")  # another dataset
    list(c)
    assert c.stats()["autotune"]["decisions"][0]["active"] == 2
    d = stoker.DataLoader(ds, batch_size=3, num_workers="auto")  # another batch size
    list(d)
    assert "last loader" not in d.stats()["autotune"]["decisions"][0]["reason"]


def test_changing_the_count_every_window_keeps_samples_order_and_values(monkeypatch):
    """A tuner that changes its mind at every window (1, 3, 2, 4, ...), persistent workers, two
    epochs: each epoch has every sample once, in the sampler's order, with the values a fixed
    num_workers gives."""
    monkeypatch.setattr(_cgroup, "usable_cpus", lambda: 4)
    monkeypatch.setattr(_measure, "WINDOW_S", 0.0)
    script = itertools.cycle([1, 3, 2, 4])
    seen = []

    def decide(self, window, batch):
        self.active = next(script)
        seen.append(self.active)
        return self.active

    monkeypatch.setattr(_autotune.Tuner, "decide", decide)
    dl = stoker.DataLoader(SlowRandom(), batch_size=3, num_workers="auto", seed="per_sample",
                           persistent_workers=True, shuffle=True)
    torch.manual_seed(3)
    epochs = [_epoch(dl), _epoch(dl)]
    assert len(set(seen)) == 4 and len(seen) > 20
    torch.manual_seed(3)
    fixed = stoker.DataLoader(SlowRandom(), batch_size=3, num_workers=3, seed="per_sample",
                              persistent_workers=True, shuffle=True)
    for got, want in zip(epochs, [_epoch(fixed), _epoch(fixed)]):
        assert sorted(got[:, 0].tolist()) == list(range(240))
        assert torch.equal(got, want)
    assert dl.stats()["autotune"]["max_workers"] == 4


@pytest.mark.parametrize("steps,depth", [
    ([1, 3, 2], None),  # the worker count only
    ([[1, 8], [3, 1], [2, 5], [3, 2], [1, 1]], "auto"),  # the count and the depth
], ids=["[1, 3, 2]-None", "[(1, 8), (3, 1), (2, 5), (3, 2), (1, 1)]-auto"])
def test_deaths_while_the_tuner_changes_its_mind_are_survived_in_order(steps, depth):
    """Workers SIGKILLed (once each, on indices 5, 37 and 90) while a scripted tuner changes the
    count (and the depth) at every window, persistent workers over two epochs: every index once,
    in the sampler's order, three deaths, no worker left behind."""
    run_ok("autotune.deaths_while_the_tuner_changes_its_mind", steps, depth,
           timeout=120)


# -- prefetch_factor="auto": the depth -------------------------------------------------------------
def _dwindow(stall=0.9, busy=1.0, workers=2, seconds=1.0, slot=1 << 20, share=None,
             headroom=None, limit=None):
    """A window in which the loop waited `stall` of the time and `workers` workers were busy
    `busy` worker-seconds per second."""
    return _windows.Window(seconds=seconds, waited_s=stall * seconds, main_cpu_s=0.1,
                            worker_cpu_s=busy * seconds, worker_busy_s=busy * seconds,
                            usable_cpus=8, worker_rss=100 << 20, slot_bytes_per_worker=0,
                            memory_headroom=headroom, memory_limit=limit, workers=workers,
                            slot_bytes=slot, shared_memory_share=share)


def _depths(tuner, windows):
    out = []
    for batch, w in enumerate(windows):
        tuner.decide(w, batch)
        out.append(tuner.depth)
    return out


@pytest.mark.unit
def test_a_stall_with_idle_workers_deepens_the_queue_up_to_the_most():
    t = _autotune.Tuner(bound=2, tune_workers=False, depth=2)
    # 2 workers busy 1 worker-second per second while the loop waited 90%: a line held by a
    # slow batch (idle 1.0 worker-second for 0.9 s of waiting)
    got = _depths(t, [_dwindow()] * 14)
    # a change, a window that straddles it (not judged), then the next judgement
    assert got == [3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 8, 8]
    assert t.active == 2
    assert "prefetch_factor 7 -> 8" in t.reason and "sat idle" in t.reason
    assert [d["prefetch_factor"] for d in t.snapshot()["decisions"]] == [2, 3, 4, 5, 6, 7, 8]


@pytest.mark.unit
def test_little_idle_or_little_waiting_leaves_the_depth():
    t = _autotune.Tuner(bound=2, tune_workers=False, depth=2)
    # idle 0.2 worker-seconds while the loop waited 0.9 s: the workers are the bottleneck
    assert set(_depths(t, [_dwindow(busy=1.8)] * 6)) == {2}
    # idle workers, but the loop hardly waited: nothing to gain
    assert set(_depths(t, [_dwindow(stall=0.03, busy=0.5)] * 6)) == {2}


@pytest.mark.unit
def test_busy_workers_get_no_deeper_queue_but_one_more_worker():
    depth_only = _autotune.Tuner(bound=4, tune_workers=False, depth=2)
    assert set(_depths(depth_only, [_dwindow(busy=1.9)] * 6)) == {2}
    both = _autotune.Tuner(bound=4, initial=2, depth=2)
    both.decide(_dwindow(busy=1.95), 0)
    assert (both.active, both.depth) == (3, 2)
    # idle workers while the loop waits: the queue deepens, no worker is added
    both = _autotune.Tuner(bound=4, initial=2, depth=2)
    both.decide(_dwindow(busy=0.5), 0)
    assert (both.active, both.depth) == (2, 3)


@pytest.mark.unit
def test_the_depth_stays_within_the_shared_memory_cap_and_the_memory_limit():
    GiB_ = GiB
    capped = _autotune.Tuner(bound=2, tune_workers=False, depth=2)
    # 64 MiB batches, 200 MiB of max_shared_memory per worker: 4 batches would not fit
    _depths(capped, [_dwindow(slot=64 << 20, share=200 << 20)] * 4)
    assert capped.depth == 2 and "max_shared_memory" in capped.reason
    tight = _autotune.Tuner(bound=2, tune_workers=False, depth=4)
    # 0.5 GiB free under an 8 GiB limit: one shallower at each judgement, down to 1
    got = _depths(tight, [_dwindow(headroom=GiB_ // 2, limit=8 * GiB_)] * 8)
    assert got == [3, 3, 2, 2, 1, 1, 1, 1]
    assert "memory limit" in tight.reason


@pytest.mark.unit
def test_short_windows_add_up_before_the_depth_is_judged():
    t = _autotune.Tuner(bound=2, tune_workers=False, depth=2)
    quarter = _dwindow(seconds=0.25)
    assert _depths(t, [quarter] * 3) == [2, 2, 2]
    assert _depths(t, [quarter]) == [3]


@pytest.mark.unit
def test_a_fixed_depth_is_left_alone():
    t = _autotune.Tuner(bound=4, initial=2)
    for b in range(6):
        t.decide(_dwindow(busy=0.2), b)
    assert t.depth is None and t.snapshot()["prefetch_factor"] is None


class HeldLine(torch.utils.data.Dataset):
    """Fast samples and, now and then, a slow one that holds the line: the other worker runs out
    of work while the loop waits. Each value also draws from torch's generator in the worker."""

    def __len__(self):
        return 4 * 150

    def __getitem__(self, i):
        time.sleep(0.08 if i % 36 == 0 else 0.001)
        return torch.tensor([float(i), torch.rand(()).item()])


@pytest.fixture
def quick_depth(monkeypatch):
    monkeypatch.setattr(_measure, "WINDOW_S", 0.05)
    monkeypatch.setattr(_autotune, "DEPTH_WINDOW_S", 0.3)


def test_a_held_line_deepens_the_queue_and_the_batches_are_torchs(quick_depth):
    """With a fixed num_workers the depth does not change which worker loads which task: the
    batches, values drawn in workers included, are torch's own DataLoader's."""
    dl = stoker.DataLoader(HeldLine(), batch_size=4, num_workers=2, prefetch_factor="auto",
                           generator=torch.Generator().manual_seed(5))
    assert dl.prefetch_factor == 2 and dl.autotune_prefetch and not dl.autotune
    got = _epoch(dl)
    auto = dl.stats()["autotune"]
    assert auto["prefetch_factor"] > 2, auto
    assert auto["workers_tuned"] is False and auto["active_workers"] == 2
    assert any("sat idle" in d["reason"] for d in auto["decisions"]), auto
    want = _epoch(torch.utils.data.DataLoader(HeldLine(), batch_size=4, num_workers=2,
                                              generator=torch.Generator().manual_seed(5)))
    assert torch.equal(got, want)


def test_the_next_epoch_starts_from_the_depth_learnt(quick_depth):
    dl = stoker.DataLoader(HeldLine(), batch_size=4, num_workers=2, prefetch_factor="auto")
    _epoch(dl)
    learnt = dl.stats()["autotune"]["prefetch_factor"]
    assert learnt > 2
    it = iter(dl)
    assert it.stats()["tasks"]["prefetch_factor"] == learnt
    assert "where the last epoch ended" in dl.stats()["autotune"]["decisions"][0]["reason"]
    del it


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        for i in range(info.id, 300, info.num_workers):
            time.sleep(0.001)
            yield torch.tensor([float(i), torch.rand(()).item()])


def test_scripted_depths_keep_every_value_with_persistent_workers_and_a_stream(monkeypatch):
    """A tuner that changes the depth at every window (1, 6, 2, 8, 3, ...) over two epochs,
    persistent workers, a shuffled map-style dataset and an IterableDataset: torch's batches."""
    monkeypatch.setattr(_measure, "WINDOW_S", 0.0)
    script = itertools.cycle([1, 6, 2, 8, 3])
    seen = []

    def decide(self, window, batch):
        self.depth = next(script)
        seen.append(self.depth)
        return self.active

    monkeypatch.setattr(_autotune.Tuner, "decide", decide)
    for ds, kw in ((SlowRandom(), {"shuffle": True}), (Stream(), {})):
        def make(cls, ds=ds, kw=kw, **extra):
            return cls(ds, batch_size=3, num_workers=2, persistent_workers=True,
                       generator=torch.Generator().manual_seed(9), **kw, **extra)

        dl = make(stoker.DataLoader, prefetch_factor="auto")
        ref = make(torch.utils.data.DataLoader)
        for _ in range(2):
            assert torch.equal(_epoch(dl), _epoch(ref))
        assert dl.stats()["autotune"]["workers_tuned"] is False
    assert len(set(seen)) == 5 and len(seen) > 20


def test_prefetch_auto_without_workers_and_through_attributes_and_enable():
    ds = SlowRandom()
    single = stoker.DataLoader(ds, prefetch_factor="auto")  # torch: no prefetch without workers
    assert single.prefetch_factor is None and single.autotune_prefetch
    assert len(list(single)) == len(ds)
    # a framework re-creating the loader from its attributes keeps the tuning
    dl = stoker.DataLoader(ds, batch_size=8, num_workers=2, prefetch_factor="auto")
    again = stoker.DataLoader(ds, batch_size=8, num_workers=dl.num_workers,
                              prefetch_factor=dl.prefetch_factor,
                              autotune_prefetch=dl.autotune_prefetch)
    list(again)
    assert again.stats()["autotune"]["prefetch_factor"] is not None
    with pytest.raises(ValueError, match="autotune_prefetch must be True or False"):
        stoker.DataLoader(ds, num_workers=2, autotune_prefetch="yes")
    stoker.enable(autotune_prefetch=True)
    try:
        plain = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=2)
        assert len(list(plain)) == len(ds) // 8
        assert stoker.stats(plain)["autotune"]["prefetch_factor"] is not None
    finally:
        stoker.disable()


def test_stoker_top_shows_the_depth():
    from stoker.tools import top

    dl = stoker.DataLoader(SlowRandom(), batch_size=2, num_workers=2, prefetch_factor="auto")
    it = iter(dl)
    next(it)
    mine = [ld for ld in top.snapshot() if ld["pid"] == os.getpid()]
    assert mine and mine[0]["prefetch_factor"] == 2
    assert "prefetch 2 (auto)" in top.render(mine, {}, 0.0)
    del it


class Uneven(torch.utils.data.IterableDataset):
    """Worker 0's stream ends after 3 items, worker 1's after 60."""

    def __iter__(self):
        wid = torch.utils.data.get_worker_info().id
        for k in range(3 if wid == 0 else 60):
            time.sleep(0.002)
            yield wid * 1000 + k


@pytest.mark.parametrize("persistent", [False, True])
def test_a_shallower_queue_after_a_stream_ended_still_delivers_the_other_streams(monkeypatch,
                                                                                 persistent):
    """The tasks an ended worker held are never answered; they must not keep counting as in
    flight, or a queue made shallower (8, then 1) starves the other worker and the epoch ends
    early."""
    monkeypatch.setattr(_measure, "WINDOW_S", 0.0)

    def decide(self, window, batch):
        self.depth = 8 if batch < 20 else 1
        return self.active

    monkeypatch.setattr(_autotune.Tuner, "decide", decide)

    def make(cls, **kw):
        return cls(Uneven(), batch_size=None, num_workers=2, persistent_workers=persistent, **kw)

    want = sorted(int(x) for x in make(torch.utils.data.DataLoader))
    dl = make(stoker.DataLoader, prefetch_factor="auto")
    for _ in range(2):
        assert sorted(int(x) for x in dl) == want


@pytest.mark.unit
def test_a_window_with_a_restarted_worker_is_not_judged(monkeypatch):
    """A worker's counters start from zero when it is restarted: the window it died in would
    read as idle workers while the loop waited (and deepen the queue for no reason)."""

    class Workers:
        def __init__(self):
            self.pids = {0: 101, 1: 102}
            self.busy = {0: 5.0, 1: 5.0}

        def view(self, w):
            return WorkerView(self.pids[w], 0.0, 0.0, 0.0, False, {
                "seconds_in": {"loading": self.busy[w], "collating": 0.0, "encoding": 0.0},
                "rss_bytes": 1})

        def schedstat_of(self, w):
            return None

        def slot_usage(self):
            return {"bytes_mapped": 4 << 20, "slots": 4}

    class Stats:
        waited_s = 0.0
        yielded = 0

    workers, stats = Workers(), Stats()
    m = _measure.Measure(stats, workers, usable_cpus=2, shared_memory_share=64 << 20)
    m.restart([0, 1])
    workers.busy = {0: 5.5, 1: 5.4}
    stats.waited_s = 0.2
    w = m.window([0, 1])
    assert w is not None and w.workers == 2 and abs(w.worker_busy_s - 0.9) < 1e-9
    assert w.slot_bytes == 1 << 20 and w.shared_memory_share == 64 << 20
    workers.pids[1], workers.busy[1] = 202, 0.01  # worker 1 died and was restarted
    stats.waited_s = 0.6
    assert m.window([0, 1]) is None
    workers.busy = {0: 6.0, 1: 0.5}
    assert m.window([0, 1]) is not None  # the next window is judged again


@pytest.mark.unit
def test_a_starting_depth_above_the_most_is_kept():
    t = _autotune.Tuner(bound=2, tune_workers=False, depth=16)
    assert _depths(t, [_dwindow(busy=0.2)] * 4) == [16] * 4
    assert "above the 8" in t.reason

