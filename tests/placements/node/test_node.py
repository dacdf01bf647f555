"""One worker pool per node (``placement=stoker.Node()``), with real ranks: processes with
RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT, as torchrun starts
them (and once under torchrun itself). Each scenario runs in subprocesses with a hard time
bound; the ranks' script is tests/node/rank.py.

What is checked is what a user relies on: the batches are those of local workers with
``seed="per_sample"``, bit for bit; the ranks share one set of workers; a pool worker's, a
rank's or the pool's own death costs no sample and duplicates none; nothing is left once the
ranks are gone; other jobs and other users get pools of their own.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time

import pytest

from support.scenarios import HERE  # tests/

RANK = os.path.join(HERE, "node", "rank.py")
# The ranks import the stoker this test runs (installed, or a source tree on PYTHONPATH) and the
# datasets of tests/.
PYTHONPATH = os.pathsep.join([HERE, *filter(None, [os.environ.get("PYTHONPATH")])])
N = 48  # samples in node_datasets.Values


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(rank: int, world: int, port: int, extra=None) -> dict:
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
               LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               PYTHONPATH=PYTHONPATH, OMP_NUM_THREADS="1", STOKER_NODE_LINGER_S="1")
    env.pop("TORCHELASTIC_RUN_ID", None)
    env.update(extra or {})
    return env


def start_ranks(tmp_path, scenario, world=2, placement="node", port=None, extra=None,
                name="report"):
    port = port or _free_port()
    rep = str(tmp_path / name)
    procs = [subprocess.Popen([sys.executable, RANK, scenario, rep, placement],
                              env=_env(r, world, port, extra), cwd=str(tmp_path),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(world)]
    return procs, rep


def finish(procs, timeout=150):
    out = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        out.append((p.returncode, err))
    return out


def reports(rep, world=2):
    return [json.load(open(f"{rep}.{r}.json")) for r in range(world)]


def run_ranks(tmp_path, scenario, world=2, placement="node", **kw):
    procs, rep = start_ranks(tmp_path, scenario, world, placement, **kw)
    results = finish(procs)
    for rc, err in results:
        assert rc == 0, err[-3000:]
    return reports(rep, world), results


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _gone(pids, within=20.0) -> list:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        left = [p for p in pids if _alive(p)]
        if not left:
            return []
        time.sleep(0.2)
    return [p for p in pids if _alive(p)]


def _indices(epoch) -> list:
    return [i for idx, _ in epoch for i in idx]


def _exactly_once(reps, world=2):
    for e in range(2):
        seen = sorted(i for r in reps for i in _indices(r["epochs"][e]))
        assert seen == list(range(N)), f"epoch {e}: {seen}"


@pytest.fixture(scope="module")
def local_reference(tmp_path_factory):
    """The same ranks with local workers and seed="per_sample"."""
    reps, _ = run_ranks(tmp_path_factory.mktemp("local"), "plain", placement="local")
    return reps


def test_same_batches_as_local_workers_one_pool_for_all_ranks(tmp_path, local_reference):
    reps, _ = run_ranks(tmp_path, "plain")
    for mine, ref in zip(reps, local_reference):
        assert mine["epochs"] == ref["epochs"]  # indices and values, bit for bit
    pools = [r["pool"] for r in reps]
    assert pools[0]["pid"] == pools[1]["pid"]
    assert pools[0]["pids"] == pools[1]["pids"] and len(pools[0]["pids"]) == 2
    # the pool is a fork of a rank: what it holds it shares with that rank and its workers. On a
    # free-threaded build, less the pages that hold the rank's objects: its collector (and
    # gc.freeze) writes a bit into every object, ~50 MB with torch imported; a pool that imported
    # torch anew would hold ~330 MB there, ~150 MB with a GIL
    limit_mb = 100 if sysconfig.get_config_var("Py_GIL_DISABLED") else 40
    assert reps[0]["pool_own_kb"] < limit_mb * 1024, reps[0]["pool_own_kb"]
    _exactly_once(reps)
    assert _gone([pools[0]["pid"], *pools[0]["pids"]]) == []


def test_pool_worker_killed_mid_epoch(tmp_path, local_reference):
    reps, _ = run_ranks(tmp_path, "kill_worker")
    _exactly_once(reps)
    for mine, ref in zip(reps, local_reference):
        assert mine["epochs"] == ref["epochs"]
    assert any("SIGKILL" in (c or "") for r in reps for c in r["deaths"]), reps


def test_pool_process_killed_mid_epoch(tmp_path, local_reference):
    reps, _ = run_ranks(tmp_path, "kill_pool")
    _exactly_once(reps)
    for mine, ref in zip(reps, local_reference):
        assert mine["epochs"] == ref["epochs"]
    # (rank 0 killed it; rank 1 may have finished its epoch by then)
    assert any("node's worker pool" in (c or "") for c in reps[0]["deaths"]), reps[0]["deaths"]


def test_template_killed_then_a_worker_the_pool_forks_on_from_a_fork_server(
        tmp_path, local_reference):
    reps, _ = run_ranks(tmp_path, "kill_template")
    assert reps[0].get("template_killed"), reps[0]
    for mine, ref in zip(reps, local_reference):
        assert mine["epochs"] == ref["epochs"]
    assert any(reps[r]["deaths"] for r in range(2)), reps
    _exactly_once(reps)
    assert _gone([reps[0]["pool"]["pid"]]) == []


def test_rank_killed_mid_epoch_the_other_finishes(tmp_path, local_reference):
    procs, rep = start_ranks(tmp_path, "kill_self")
    (rc0, err0), (rc1, _) = finish(procs)
    assert rc1 == -signal.SIGKILL
    assert rc0 == 0, err0[-3000:]
    mine = json.load(open(f"{rep}.0.json"))
    assert mine["epochs"] == local_reference[0]["epochs"]
    assert _gone([mine["pool"]["pid"], *mine["pool"]["pids"]]) == []


def test_every_rank_killed_leaves_nothing(tmp_path):
    procs, rep = start_ranks(tmp_path, "hold")
    deadline = time.monotonic() + 120
    while not all(os.path.exists(f"{rep}.{r}.json") for r in range(2)):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
            [p.communicate()[1][-2000:] for p in procs if p.poll() is not None]
        time.sleep(0.1)
    pool = reports(rep)[0]["pool"]
    # `stoker top` lists the pool once, with its workers (the ranks list none of their own)
    top = subprocess.run([sys.executable, "-m", "stoker", "top", "--once", "--json"],
                         env=dict(os.environ, PYTHONPATH=PYTHONPATH), capture_output=True,
                         text=True, timeout=60)
    shown = {ld["pid"]: ld for ld in json.loads(top.stdout)}
    assert sorted(w["pid"] for w in shown[pool["pid"]]["workers"]) == sorted(pool["pids"])
    assert all(not shown[p.pid]["workers"] for p in procs if p.pid in shown)
    for p in procs:
        p.send_signal(signal.SIGKILL)
    finish(procs)
    assert _gone([pool["pid"], *pool["pids"]]) == []


def test_two_jobs_get_two_pools(tmp_path):
    a, rep_a = start_ranks(tmp_path, "plain", name="a")
    b, rep_b = start_ranks(tmp_path, "plain", name="b")
    for rc, err in finish(a) + finish(b):
        assert rc == 0, err[-3000:]
    pa, pb = reports(rep_a)[0]["pool"], reports(rep_b)[0]["pool"]
    assert pa["pid"] != pb["pid"] and pa["job"] != pb["job"]


def test_tensor_parallel_pair_loads_each_sample_once(tmp_path):
    calls = tmp_path / "calls"
    reps, _ = run_ranks(tmp_path, "tp", extra={"CALLS": str(calls)})
    assert reps[0]["epochs"] == reps[1]["epochs"]  # the same batches on both ranks
    loaded = [int(x) for x in calls.read_text().split()]
    assert sorted(loaded) == sorted(list(range(N)) * 2)  # two epochs, each sample once


def test_a_pair_out_of_step_still_loads_each_sample_once(tmp_path):
    """Whatever the timing: rank 1 takes each batch 0.15 s after rank 0 has let go of it (no
    barrier), and the pool keeps it for rank 1 instead of loading it again."""
    calls = tmp_path / "calls"
    reps, _ = run_ranks(tmp_path, "tp_apart", extra={"CALLS": str(calls)})
    assert reps[0]["epochs"] == reps[1]["epochs"]
    loaded = [int(x) for x in calls.read_text().split()]
    assert sorted(loaded) == sorted(list(range(N)) * 2), len(loaded)


def test_a_pair_whose_datasets_hold_a_shared_list_each_is_one_group(tmp_path):
    """Each rank builds its own SharedList (another memfd, the same items): the pool tells them
    by their contents, so the pair shares one group and loads each sample once."""
    calls = tmp_path / "calls"
    reps, _ = run_ranks(tmp_path, "tp_shared", extra={"CALLS": str(calls)})
    assert reps[0]["epochs"] == reps[1]["epochs"]
    assert reps[0]["pool_now"]["pids"] == reps[1]["pool_now"]["pids"], reps
    loaded = [int(x) for x in calls.read_text().split()]
    assert sorted(loaded) == sorted(list(range(N)) * 2), len(loaded)


def test_what_each_ranks_dataset_prints_shows_on_that_rank(tmp_path):
    procs, rep = start_ranks(tmp_path, "prints")
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=150)
        assert p.returncode == 0, err[-3000:]
        outs.append(out)
    for rank, out in enumerate(outs):
        lines = [x for x in out.splitlines() if x.startswith("PRINT-")]
        assert lines and set(lines) == {f"PRINT-{rank}"}, (rank, sorted(set(lines)))


def test_two_datasets_share_the_nodes_workers_never_more_than_n_at_once(tmp_path):
    """Node(workers=2) bounds the node: two ranks whose datasets differ (a group each) never
    load more than 2 samples at once between them, counted across every process; and each
    rank's stats name the pool workers by their own pids."""
    track = tmp_path / "track"
    reps, _ = run_ranks(tmp_path, "shards", extra={"TRACK": str(track)})
    now, most = (int(x) for x in track.read_text().split())
    assert now == 0 and most == 2, (now, most)  # (the budget reached, never passed)
    for r in reps:
        pool = r["pool_now"]
        assert pool["pid"] not in pool["pids"] and pool["pids"], pool
        assert set(r["worker_pids"]) <= set(pool["pids"]), (r["worker_pids"], pool)
    assert set(reps[0]["pool_now"]["pids"]).isdisjoint(reps[1]["pool_now"]["pids"])


@pytest.mark.parametrize("case", ["helper_exits", "many_fds", "sigchld_ignored"])
def test_a_rank_that_forks_helpers_holds_many_descriptors_or_ignores_sigchld(case):
    """A helper forked from the rank exits normally (its exit hook runs) and ends nothing of the
    rank's; a rank holding 1,100 descriptors starts a pool that keeps their numbers; a rank that
    ignores SIGCHLD starts one too. Each rank's two epochs get every sample."""
    env = dict(os.environ, PYTHONPATH=PYTHONPATH, STOKER_NODE_LINGER_S="1")
    r = subprocess.run([sys.executable, os.path.join(HERE, "node", "edges.py"), case,
                        f"{case}-{os.getpid()}"], capture_output=True, text=True, timeout=120,
                       env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["epochs"] == [list(range(48))] * 2, out
    if case == "helper_exits":
        assert out["helper"] == 0, out


def _as_nobody(fn) -> str:
    """Runs `fn` in a forked child switched to uid/gid 65534 (no exec: this machine's Python may
    not be readable by that user); returns what it returned, as text."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            os.setgid(65534)
            os.setuid(65534)
            text = str(fn())
        except BaseException as e:  # noqa: BLE001 (reported to the parent)
            text = f"error: {type(e).__name__}: {e}"
        os.write(w, text.encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        text = f.read()
    os.waitpid(pid, 0)
    return text


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another uid")
def test_another_user_can_neither_join_nor_squat(tmp_path):
    from stoker.placements.node import wire

    procs, rep = start_ranks(tmp_path, "hold", world=1, name="root")
    deadline = time.monotonic() + 120
    while not os.path.exists(f"{rep}.0.json"):
        assert time.monotonic() < deadline and procs[0].poll() is None
        time.sleep(0.1)
    pool = reports(rep, 1)[0]["pool"]
    job = pool["job"]

    def join():
        sock = wire.new_socket()
        sock.connect(wire.address_for(0, job))  # root's pool, by its name
        sock.settimeout(10)
        try:
            wire.send(sock, ("hello", {}))
            return "refused" if wire.recv(sock) is None else "answered"
        except (ConnectionResetError, BrokenPipeError):  # closed by the pool at once
            return "refused"

    assert wire.address(job) != wire.address_for(65534, job)  # another user: another pool
    assert _as_nobody(join) == "refused"
    procs[0].kill()
    finish(procs)
    assert _gone([pool["pid"], *pool["pids"]]) == []

    # A process of another user holding this user's name: the loader uses its own workers.
    import warnings

    import stoker
    from node import node_datasets  # noqa: F401 (tests/ is on sys.path)

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.setgid(65534)
        os.setuid(65534)
        listener = wire.new_socket()  # an abstract name: any user may bind any
        listener.bind(wire.address_for(0, "name:squatted"))
        listener.listen(8)
        os.write(w, b"x")
        while True:
            conn, _ = listener.accept()
    os.close(w)
    try:
        assert os.read(r, 1) == b"x"
        dl = stoker.DataLoader(node_datasets.Values(), batch_size=4, num_workers=2,
                               placement=stoker.Node(name="squatted"))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = sorted(i for b in dl for i in b["index"].tolist())
        assert got == list(range(N))
        assert any("another user's process" in str(c.message) for c in caught), caught
        assert "pool" not in dl.stats()
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(r)


def _can_mount_namespace() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("mount"):
        return False
    return subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_mount_namespace(),
                    reason="needs root and a mount namespace to run a rank as another uid")
def test_another_user_of_the_same_job_gets_a_pool_of_its_own():
    """A rank of uid 65534 with root's MASTER_ADDR:MASTER_PORT while root's pool runs: it starts
    a pool of its own (its uid), is served by it, and root's pool carries on; both end."""
    out = tempfile.mkdtemp(prefix="stoker-uid-", dir="/tmp")
    os.chmod(out, 0o777)  # the other user's rank writes its report here
    try:
        env = dict(os.environ, PYTHONPATH=PYTHONPATH)
        done = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable,
                               os.path.join(HERE, "node", "other_user.py"), out,
                               str(_free_port())], env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        with open(os.path.join(out, "result.json")) as f:
            res = json.load(f)
        assert res["rc"] == 0, res["stderr"]
        root, nobody = res["root"], res["nobody"]
        assert root["pool"]["job"] == nobody["pool"]["job"]  # one job ...
        assert nobody["pool"]["pid"] != root["pool"]["pid"]  # ... two pools
        assert (res["root_pool_uid"], nobody["pool_uid"]) == (0, 65534)
        assert res["root_pool_alive"]  # the other user's rank did not end root's pool
        for epoch in nobody["epochs"]:
            assert sorted(_indices(epoch)) == list(range(N))
        assert _gone([root["pool"]["pid"], *root["pool"]["pids"],
                      nobody["pool"]["pid"], *nobody["pool"]["pids"]]) == []
    finally:
        shutil.rmtree(out, ignore_errors=True)


def test_torchrun_stoker_run_placement_node_plain_torch_loader(tmp_path):
    """An unchanged script with torch's own DataLoader: `torchrun --nproc-per-node 2 -m stoker
    run --placement node script.py`."""
    rep = str(tmp_path / "tr")
    env = dict(os.environ, PYTHONPATH=PYTHONPATH, OMP_NUM_THREADS="1", STOKER_NODE_LINGER_S="1")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                        "-m", "stoker", "run", "--placement", "node",
                        os.path.join(HERE, "node", "torchrun_plain.py"), rep],
                       env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "terminate called" not in r.stderr
    reps = reports(rep)
    assert sorted(reps[0]["indices"] + reps[1]["indices"]) == list(range(N))
    assert reps[0]["pool"]["pid"] == reps[1]["pool"]["pid"]
    assert reps[0]["pool"]["job"].startswith("torchelastic:")
    assert _gone([reps[0]["pool"]["pid"], *reps[0]["pool"]["pids"]]) == []


def _batches(dl, count=None):
    out = []
    for b in dl:
        out.append((b["index"].tolist(), b["x"].tolist()))
        if count is not None and len(out) == count:
            break
    return out


@pytest.mark.parametrize("first, then", [("local", "node"), ("node", "local")])
def test_resume_across_placements(first, then, monkeypatch):
    """A state saved with local workers resumes under node placement, and back: the rest of the
    epoch, bit for bit."""
    import torch

    import stoker
    from node import node_datasets

    monkeypatch.setenv("STOKER_NODE_LINGER_S", "1")

    def make(kind):
        placement = stoker.Node(workers=2, name=f"resume-{os.getpid()}") if kind == "node" \
            else None
        g = torch.Generator().manual_seed(5)
        return stoker.DataLoader(node_datasets.Values(), batch_size=4, shuffle=True,
                                 generator=g, num_workers=2, seed="per_sample",
                                 placement=placement)

    torch.manual_seed(0)
    whole = _batches(make("local"))
    torch.manual_seed(0)
    a = make(first)
    head = _batches(a, 5)
    state = a.state_dict()
    del a
    b = make(then)
    b.load_state_dict(state)
    assert head + _batches(b) == whole


def _node(tag: str):
    import stoker

    return stoker.Node(workers=2, name=f"{tag}-{os.getpid()}")


def test_poison_sample_segfault_named_and_quarantined(monkeypatch):
    """A decoder that segfaults on one sample, in a pool worker: the death is named with the
    sample (and the stack at the crash), the sample is quarantined after its second death and,
    under on_error="skip", the epoch finishes without it."""
    import stoker
    from scenario_datasets import KillsSelfAt

    monkeypatch.setenv("STOKER_NODE_LINGER_S", "1")
    dl = stoker.DataLoader(KillsSelfAt(7, signal.SIGSEGV, n=32), batch_size=1, num_workers=2,
                           on_error="skip", placement=_node("segv"))
    got = [int(y) for _, y in dl]
    assert sorted(got) == [i for i in range(32) if i != 7]
    deaths = dl.stats()["deaths"]
    assert deaths and all("SIGSEGV" in d["cause"] for d in deaths), deaths
    assert all(d.get("index") == 7 for d in deaths), deaths


def test_threads_in_pool_workers_a_segfault_is_named_not_its_batch_mates(monkeypatch):
    """threads_per_worker in the pool's workers: the batches of one thread; a sample that
    segfaults while its batch-mates load at once costs the pool worker, the rank re-issues the
    batch one sample at a time, the pool loads it so, and the culprit alone is named and then
    quarantined (before, the whole batch died again and again until max_restarts)."""
    import stoker
    from scenario_datasets import KillsSelfAt, Squares

    monkeypatch.setenv("STOKER_NODE_LINGER_S", "1")
    plain = [y.tolist() for _, y in stoker.DataLoader(Squares(), batch_size=8, num_workers=2)]
    dl = stoker.DataLoader(Squares(), batch_size=8, num_workers=2, threads_per_worker=4,
                           placement=_node("thr"))
    assert [y.tolist() for _, y in dl] == plain
    dl = stoker.DataLoader(KillsSelfAt(21, signal.SIGSEGV), batch_size=8, num_workers=2,
                           threads_per_worker=8, on_error="skip", placement=_node("thr-segv"))
    got = sorted(int(i) for _, y in dl for i in y)
    assert got == [i for i in range(64) if i != 21]
    assert [s.index for s in dl.skipped] == [21], dl.skipped
    named = {d.index for d in dl.deaths if d.index is not None}
    assert named == {21}, dl.deaths
    assert len(dl.deaths) <= 3, dl.deaths


def test_hang_in_a_pool_worker_is_killed_and_named(monkeypatch):
    import stoker
    from scenario_datasets import HangsAt

    monkeypatch.setenv("STOKER_NODE_LINGER_S", "1")
    dl = stoker.DataLoader(HangsAt(5, n=16), batch_size=1, num_workers=2, hang_timeout=1.5,
                           on_error="skip", placement=_node("hang"))
    got = [int(y) for _, y in dl]
    assert sorted(got) == [i for i in range(16) if i != 5]
    deaths = dl.stats()["deaths"]
    assert deaths and all("hung" in d["cause"] or "hang" in d["cause"] for d in deaths), deaths


def test_persistent_workers_two_epochs_same_as_local(monkeypatch):
    import torch

    import stoker
    from node import node_datasets

    monkeypatch.setenv("STOKER_NODE_LINGER_S", "1")

    def epochs(placement):
        torch.manual_seed(1)
        dl = stoker.DataLoader(node_datasets.Values(), batch_size=4, shuffle=True,
                               num_workers=2, persistent_workers=True, seed="per_sample",
                               placement=placement)
        return [_batches(dl) for _ in range(2)]

    local, node = epochs(None), epochs(_node("persistent"))
    assert local == node and local[0] != local[1]


def test_two_datasets_in_one_pool_never_mix(monkeypatch):
    """Two loaders of one job over different datasets: one pool, a set of workers each, and
    each loader gets only its own samples (with the values its own dataset makes)."""
    import stoker
    from node import node_datasets

    monkeypatch.setenv("STOKER_NODE_LINGER_S", "1")
    node = _node("two")
    a = stoker.DataLoader(node_datasets.Values(offset=0), batch_size=4, num_workers=2,
                          placement=node)
    b = stoker.DataLoader(node_datasets.Values(offset=1000), batch_size=4, num_workers=2,
                          placement=node)
    got_a, got_b, pools = [], [], []
    for step, (x, y) in enumerate(zip(a, b)):
        got_a += x["index"].tolist()
        got_b += y["index"].tolist()
        # a sample's values are rand() + its position in its own dataset
        assert x["x"][:, 0].floor().long().tolist() == x["index"].tolist()
        assert y["x"][:, 0].floor().long().tolist() == (y["index"] - 1000).tolist()
        if step == 0:
            pools = [a.stats()["pool"], b.stats()["pool"]]
    assert got_a == list(range(N)) and got_b == [1000 + i for i in range(N)]
    assert pools[0]["pid"] == pools[1]["pid"]  # one pool for the job
    assert not set(pools[0]["pids"]) & set(pools[1]["pids"])  # workers of its own each


def test_persistent_epoch_left_early_does_not_leak_into_the_next(monkeypatch):
    """A loop that breaks out of an epoch (max steps) with tasks still in the pool: the next
    epoch of the persistent loader gets its own batches only (task numbers start again at 0;
    the old epoch's late outcomes must not pass for them)."""
    import torch

    import stoker
    from scenario_datasets import Slow

    monkeypatch.setenv("STOKER_NODE_LINGER_S", "1")
    torch.manual_seed(0)
    dl = stoker.DataLoader(Slow(64), batch_size=4, shuffle=True, num_workers=2,
                           persistent_workers=True, placement=_node("early"))
    for _ in dl:
        break
    got = [int(y) for _, ys in dl for y in ys]
    assert sorted(got) == list(range(64))


def test_pool_killed_while_the_loop_computes(monkeypatch):
    """The pool dies while the loop is busy with batches it has: the next task's send finds the
    connection gone before any read does; the death is still named and every sample comes."""
    import stoker
    from scenario_datasets import Squares

    monkeypatch.setenv("STOKER_NODE_LINGER_S", "1")
    dl = stoker.DataLoader(Squares(200), batch_size=4, num_workers=2, placement=_node("busy"))
    it = iter(dl)
    got = [int(y) for y in next(it)[1]]
    time.sleep(1.0)  # everything prefetched
    os.kill(dl.stats()["pool"]["pid"], signal.SIGKILL)
    time.sleep(1.0)  # the loop's "GPU step"
    got += [int(y) for _, ys in it for y in ys]
    assert sorted(got) == list(range(200))
    assert any("node's worker pool" in d["cause"] for d in dl.stats()["deaths"])


def test_a_rank_leaving_hands_over_the_tasks_another_joined(monkeypatch):
    """Two identical loaders (a tensor-parallel pair): the second joins the first's queued
    tasks; the first ends at once; the second still gets every batch."""
    import torch

    import stoker
    from scenario_datasets import Slow

    monkeypatch.setenv("STOKER_NODE_LINGER_S", "1")
    node = stoker.Node(workers=1, name=f"leave-{os.getpid()}")

    def make():
        return stoker.DataLoader(Slow(32), batch_size=4, num_workers=2, placement=node)

    first, second = make(), make()
    torch.manual_seed(0)
    it_a = iter(first)
    torch.manual_seed(0)
    it_b = iter(second)
    time.sleep(0.05)
    del it_a  # the first rank's iterator ends (a break, or its process died)
    gc.collect()
    assert sorted(int(y) for _, ys in it_b for y in ys) == list(range(32))


def test_many_pool_worker_kills_nothing_lost_or_doubled(monkeypatch):
    """A chaos run: a thread SIGKILLs a random pool worker (busy, idle or still starting) every
    0.2-0.5 s while a persistent loader reads epochs (three at least, until twenty kills); every
    epoch's samples arrive exactly once, with their values; no pool process is left after."""
    import random
    import threading

    import psutil
    import torch

    import stoker
    from node import node_datasets

    monkeypatch.setenv("STOKER_NODE_LINGER_S", "1")
    node = _node("chaos")
    n = 240
    dl = stoker.DataLoader(node_datasets.Values(n=n, slow_s=0.004), batch_size=4, shuffle=True,
                           num_workers=3, persistent_workers=True, max_restarts=10_000,
                           placement=node)
    stop = threading.Event()
    kills = []
    pool_pid = []

    def chaos():
        rng = random.Random(7)
        while not stop.wait(rng.uniform(0.2, 0.5)):
            try:  # the pool's workers for this dataset now, as its stats name them
                workers = [p for p in dl.stats()["pool"]["pids"] if psutil.pid_exists(p)]
            except (KeyError, TypeError):
                continue
            if workers:
                victim = rng.choice(workers)
                try:
                    os.kill(victim, signal.SIGKILL)
                    kills.append(victim)
                except ProcessLookupError:
                    pass

    torch.manual_seed(0)
    thread = None
    try:
        epoch = 0
        while epoch < 3 or (len(kills) < 20 and epoch < 30):  # three epochs, twenty kills
            epoch += 1
            got = []
            for b in dl:
                if thread is None:
                    pool_pid.append(dl.stats()["pool"]["pid"])
                    thread = threading.Thread(target=chaos, daemon=True)
                    thread.start()
                got += b["index"].tolist()
                assert b["x"][:, 0].floor().long().tolist() == b["index"].tolist()
            assert sorted(got) == list(range(n)), f"epoch {epoch}"
    finally:
        stop.set()
        if thread is not None:
            thread.join()
    assert len(kills) >= 20, kills
    dl = None  # (the loader goes: its pool follows)
    assert _gone(pool_pid) == []


@pytest.mark.unit
def test_node_option_forms_and_what_it_implies():
    import stoker
    from stoker.config.options import Options

    for given in ("node", stoker.Node(), {"kind": "node", "workers": "auto", "name": None}):
        assert Options(placement=given).placement == stoker.Node()
    o = Options(placement=stoker.Node(workers=3, name="job"))
    assert Options(**o.to_json()).placement == stoker.Node(workers=3, name="job")  # enable()
    assert o.seed == "per_sample" and o.autotune is False
    with pytest.raises(ValueError, match="workers"):
        stoker.Node(workers=0)
    with pytest.raises(ValueError, match="name"):
        stoker.Node(name="")


class _Prints:
    """Prints a line for one sample (a user's debugging print in __getitem__)."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 3:
            print(f"node-pool-print {i}", flush=True)
        return i


def test_what_a_dataset_prints_in_a_pool_worker_shows_on_the_rank(capfd, monkeypatch):
    import stoker

    monkeypatch.setenv("STOKER_NODE_LINGER_S", "1")
    dl = stoker.DataLoader(_Prints(), batch_size=2, num_workers=2, placement=_node("prints"))
    assert sorted(int(x) for b in dl for x in b) == list(range(8))
    assert "node-pool-print 3" in capfd.readouterr().out


def test_a_pool_killed_before_it_bound_its_name_is_started_again(monkeypatch):
    """The process that was to become the pool is killed while it imports (the OOM killer, a
    signal meant for another): the rank starts another instead of waiting a minute for it.
    One that fails on its own (an import error) is named at once."""
    import stoker
    from node import node_datasets
    from stoker.common.errors import EngineError
    from stoker.placements.node import rendezvous

    monkeypatch.setenv("STOKER_NODE_LINGER_S", "1")
    real, calls = rendezvous._start_pool, []

    def killed_first(job):
        calls.append(job)
        return -signal.SIGKILL if len(calls) == 1 else real(job)

    monkeypatch.setattr(rendezvous, "_start_pool", killed_first)
    dl = stoker.DataLoader(node_datasets.Values(), batch_size=4, num_workers=2,
                           placement=_node("starter-killed"))
    assert sorted(i for b in dl for i in b["index"].tolist()) == list(range(N))
    assert len(calls) == 2

    monkeypatch.setattr(rendezvous, "_start_pool", lambda job: 1)
    with pytest.raises(EngineError, match="could not start: its process exited with status 1"):
        rendezvous.connect("name:stoker-test-never-there")


def test_a_dataset_that_cannot_start_in_the_pool_ends_the_run_at_once(monkeypatch):
    """Every pool worker fails while unpickling the dataset: the group breaks after three such
    starts, and the rank raises at once (it does not restart its virtual workers into the
    broken group until max_restarts runs out)."""
    import stoker
    from node import node_datasets

    monkeypatch.setenv("STOKER_NODE_LINGER_S", "1")
    dl = stoker.DataLoader(node_datasets.CannotUnpickle(), batch_size=4, num_workers=2,
                           max_restarts=1000, placement=_node("cannot-start"))
    with pytest.raises(stoker.WorkerCrashed, match="while starting"):
        list(dl)
    assert len(dl.deaths) <= 2, dl.deaths  # (not max_restarts of them)
