"""Python 3.14's default start method (forkserver), spawn and the node pool pickle the dataset,
collate_fn and worker_init_fn: what pickle refuses by name (a local class, a lambda, a closure, a
class of ``python -c``, a partial of those) crosses by value (stoker/pickling/by_value.py), each compared
with torch's loader in the same test; handles a dataset opens in each process
(``stoker.per_worker``) under fork, spawn, a restart and ``num_workers=0``, with sqlite3 and a
real Lance dataset. This machine has Python 3.11: each start method is named explicitly."""

from __future__ import annotations

import collections
import copy
import dataclasses
import enum
import functools
import json
import logging
import os
import pickle
import sqlite3
import subprocess
import sys
import threading
import typing
from multiprocessing import reduction

import numpy as np
import pytest
import torch

import stoker
from scenario_datasets import Squares
from scenarios.per_worker import Rows
from stoker.pickling import by_value as _by_value
from stoker.pickling import main_script as _main_script
from support.scenarios import (
    HERE,  # tests/
    run_ok,
)

PICKLED = ["spawn", "forkserver"]


def _local_parts(n: int = 24):
    """A dataset of a class defined here, a closure worker_init_fn and the collate_fns that
    pickle refuses: what real training code is full of."""

    class Local(torch.utils.data.Dataset):
        def __init__(self, n):
            self.n, self.offset = n, 0

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            return torch.tensor([i + self.offset])

    scale = 1000

    def init(worker_id):
        torch.utils.data.get_worker_info().dataset.offset = scale * (worker_id + 1)

    def times(batch, k):
        return torch.cat(batch) * k

    # a function with globals of its own (made by exec, as attrs makes its methods)
    made = {"__name__": "json", "torch": torch}
    exec("def made_collate(batch):\n    return torch.cat(batch) * 5\n", made)
    collates = {"lambda": lambda batch: torch.cat(batch) + 1,
                "partial": functools.partial(times, k=3), "exec": made["made_collate"]}
    return Local(n), init, collates


def _batches(lib, ctx, collate, **kw):
    ds, init, collates = _local_parts()
    dl = lib.DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context=ctx,
                        collate_fn=collates[collate], worker_init_fn=init, **kw)
    return [b.tolist() for b in dl]


@pytest.mark.parametrize("collate", ["lambda", "partial", "exec"])
@pytest.mark.parametrize("ctx", PICKLED)
def test_a_local_class_a_closure_and_a_lambda_or_partial_cross_by_value(ctx, collate):
    with pytest.raises((AttributeError, pickle.PicklingError, TypeError)):
        _batches(torch.utils.data, ctx, collate)  # torch: "Can't pickle local object"
    assert _batches(stoker, ctx, collate) == _batches(stoker, "fork", collate)


@pytest.mark.parametrize("collate", ["lambda", "partial"])
def test_the_node_pool_carries_them_by_value(monkeypatch, collate):
    monkeypatch.setenv("STOKER_NODE_LINGER_S", "1")
    node = stoker.Node(workers=2, name=f"by-value-{collate}-{os.getpid()}")
    got = [v for b in _batches(stoker, None, collate, placement=node) for v in b]
    # (which pool worker loads a batch is the pool's choice: its worker_init_fn's offset says)
    forked = [v for b in _batches(stoker, "fork", collate) for v in b]
    assert [v % 1000 for v in got] == [v % 1000 for v in forked], got
    assert {v // 1000 for v in got} == {v // 1000 for v in forked}, got  # both workers' offsets


# the start method set as Python 3.14 sets it by default, and no multiprocessing_context
_PYTHON_C = """
import collections, json, multiprocessing, sys, typing, torch, stoker
multiprocessing.set_start_method(sys.argv[1])

T = typing.TypeVar("T")

class Rows(torch.utils.data.Dataset, typing.Generic[T]):
    def __len__(self):
        return 12
    def __getitem__(self, i):
        return torch.tensor([i * i])

out = {}
runs = [("torch", torch.utils.data, {}), ("stoker", stoker, {})]
if sys.argv[2:3] == ["node"]:
    runs.append(("node", stoker, {"placement": stoker.Node(workers=2, name=sys.argv[3])}))
for name, lib, kw in runs:
    try:
        dl = lib.DataLoader(Rows(), batch_size=4, num_workers=2,
                            collate_fn=lambda b: torch.stack(b) + 0, **kw)
        out[name] = [b.tolist() for b in dl]
    except Exception as e:
        out[name] = type(e).__name__

# what a worker sends back of this session's classes: a sample type, an exception to catch
Sample = collections.namedtuple("Sample", "i sq")

class BadSample(Exception):
    pass

class Samples(torch.utils.data.Dataset):
    def __len__(self):
        return 3
    def __getitem__(self, i):
        if i == 2:
            raise BadSample(f"sample {i}")
        return Sample(i, i * i)

got = []
methods = dict(vars(Sample))
try:
    for s in stoker.DataLoader(Samples(), batch_size=None, num_workers=1):
        got.append([type(s) is Sample, list(s)])
except BadSample as e:
    got.append(str(e).splitlines()[0])
# the class that comes back is this one, untouched (nothing of the worker's copy set on it)
got.append(all(vars(Sample)[k] is v for k, v in methods.items()))
out["returned"] = got
print(json.dumps(out))
"""


@pytest.mark.parametrize("ctx", PICKLED)
def test_a_class_of_python_c_under_the_default_start_method(ctx):
    """``python -c`` (and a notebook) has no file the worker could run again: its classes go by
    value. torch's worker dies unpickling the dataset (or pickle refuses the lambda). The start
    method is the process's default, set as Python 3.14 sets it, with no flag; under forkserver
    the node pool's workers load it too."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), STOKER_NODE_LINGER_S="1")
    extra = ["node", f"python-c-{os.getpid()}"] if ctx == "forkserver" else []
    r = subprocess.run([sys.executable, "-c", _PYTHON_C, ctx, *extra], capture_output=True,
                       text=True, timeout=120, env=env, cwd=HERE)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    squares = [[[0], [1], [4], [9]], [[16], [25], [36], [49]], [[64], [81], [100], [121]]]
    assert out["stoker"] == squares, out
    if extra:
        assert out["node"] == squares, out
    assert out["returned"] == [[True, [0, 0]], [True, [1, 1]],
                               "Caught BadSample in DataLoader worker process 0 while loading "
                               "dataset index 2.", True], out
    assert not isinstance(out["torch"], list), out  # RuntimeError: its worker exited


def test_a_training_script_under_spawn_and_forkserver_gives_what_fork_gives():
    """A script's module state, its top-level classes, and, under its main guard, a closure
    worker_init_fn writing that state and the dataset, a namedtuple, a shared tensor, an
    mp.Value and an mp.Queue: one pickler for all of it, so the worker's module, objects
    reached twice and multiprocessing's reductions are what they are under fork."""
    script = os.path.join(HERE, "scenarios", "by_value_script.py")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, script, "fork", "spawn", "forkserver"],
                       capture_output=True, text=True, timeout=240, env=env,
                       cwd=os.path.dirname(script))
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    forked = out["fork"]
    assert forked["guarded"][0][1] == [True, 10, "w0", "set in the worker",
                                       "init ran in w0", 1.0], forked
    assert forked["shared_tensor"] == [41, 0] and forked["value"] == 7, forked
    assert out["spawn"] == forked and out["forkserver"] == forked, out


class Colour(enum.Enum):
    RED = 1


@dataclasses.dataclass
class Point:
    x: int
    y: int


Pair = collections.namedtuple("Pair", "a b")


def module_level(batch, k=2):
    return torch.cat(batch) * k


_SCRIPT = """
import json, multiprocessing, torch, stoker


class Kept(torch.utils.data.Dataset):  # at the top level: found by name in the worker
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.tensor([i])


if __name__ == "__main__":
    multiprocessing.set_start_method("forkserver")

    class Rows(Kept):  # the worker runs this script as __mp_main__, skipping this block
        def __getitem__(self, i):
            return torch.tensor([i * 10])

    def collate(batch):
        return torch.cat(batch) + 1

    out = {}
    for name, lib in (("torch", torch.utils.data), ("stoker", stoker)):
        try:
            dl = lib.DataLoader(Rows(), batch_size=4, num_workers=2, collate_fn=collate)
            out[name] = [b.tolist() for b in dl]
        except Exception as e:
            out[name] = type(e).__name__
    from stoker import _by_value
    out["by_value"] = [_by_value.needed(x) for x in (Kept, Rows, collate)]
    print(json.dumps(out))
"""


def test_a_class_and_a_function_under_the_scripts_main_guard(tmp_path):
    """A script's classes are found by name where the worker runs the script again, except what
    it defines under ``if __name__ == "__main__":``, which goes by value."""
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=180, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["stoker"] == [[1, 11, 21, 31], [41, 51, 61, 71]], out
    assert not isinstance(out["torch"], list), out
    assert out["by_value"] == [False, True, True], out  # Kept, Rows, collate


@pytest.mark.unit
def test_what_pickles_today_pickles_byte_for_byte():
    def today(obj) -> bytes:  # as Process.start() pickles, with the Popen being started
        from multiprocessing import context

        context.set_spawning_popen(_by_value._Probe())
        try:
            return bytes(reduction.ForkingPickler.dumps(obj, pickle.HIGHEST_PROTOCOL))
        finally:
            context.set_spawning_popen(None)

    objects = (Squares(64), functools.partial(module_level, k=3), np.arange(10_000),
               {"a": np.ones((3, 4)), "f": module_level, "cls": Squares, "lens": [1, 2]},
               logging.getLogger("stoker.test"), Squares(3).__len__, Colour.RED, Point(1, 2),
               Pair(3, 4), typing.AnyStr, collections.OrderedDict(a=1), frozenset({1, 2}),
               torch.arange(100_000), torch.float16, np.dtype("int32"), 3 + 4j, b"x" * 100)
    assert _by_value.dumps(objects) == today(objects)
    assert not any(_by_value.needed(x) for x in (module_level, Squares, reduction.ForkingPickler, len))
    ds, init, collates = _local_parts()
    assert _by_value.needed(type(ds)) and _by_value.needed(init)
    assert _by_value.needed(collates["lambda"])


_SAME_BYTES = r"""
import hashlib, sys
from stoker import _by_value
ns = {"scale": 3, "offset": 1, "name": "x", "__name__": "made"}
exec("def f(v):\n    return scale * v + offset + len(name) + (lambda: z)()\n", ns)
def outer():
    a, b, c = 1, 2, 3
    return lambda v: ns["f"](v) + a + b + c + len(sys.argv)
print(hashlib.sha256(_by_value.dumps((ns["f"], outer()))).hexdigest())
"""


def test_a_by_value_function_pickles_to_the_same_bytes_in_every_process():
    """The node pool's group key is a hash of the pickle: ranks (each its own hash seed) whose
    loaders hold the same by-value functions must make the same bytes."""
    digests = {subprocess.run([sys.executable, "-c", _SAME_BYTES], capture_output=True,
                              text=True, check=True,
                              env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout
               for seed in (1, 2, 3)}
    assert len(digests) == 1, digests


class _Replaced:
    def __init__(self, v):
        self.v = v


@pytest.mark.unit
def test_a_reducer_replaced_with_copyreg_is_the_one_used():
    """As each standard Pickler reads copyreg's table anew, a reducer registered again for a
    type replaces the last one in stoker's reused picklers too."""
    import copyreg

    from stoker.pickling import pickler as _pickling

    try:
        for v in (1, 2):
            copyreg.pickle(_Replaced, lambda obj, v=v: (_Replaced, (v,)))
            assert pickle.loads(_pickling.dumps(_Replaced(0))).v == v
            assert pickle.loads(_by_value.dumps(_Replaced(0))).v == v
    finally:
        copyreg.dispatch_table.pop(_Replaced, None)


@pytest.mark.unit
def test_what_lambdas_share_crosses_once_and_a_memmap_as_its_file(tmp_path):
    """One pickler for the dataset and the by-value functions: an array reached from the
    dataset and from eleven lambdas is laid beside the pickle once (and is one array in the
    worker); a memmap a lambda captures travels as its file, not its bytes."""
    from stoker.wire.sealed import Sealed

    ds, _, _ = _local_parts()
    ds.big = np.ones(2**21, dtype=np.float32)  # 8 MB
    fields = [lambda b, k=k: ds.big[k] for k in range(10)]
    sealed = Sealed((ds, lambda b: (fields, ds.big.sum()), None))
    try:
        assert sealed.nbytes < 9 * 2**20, sealed.nbytes
    finally:
        sealed.close()
    path = tmp_path / "big.bin"
    np.ones(2**22, dtype=np.float32).tofile(path)  # 16 MB
    mm = np.memmap(path, dtype=np.float32, mode="r")
    sealed = Sealed((ds, lambda b: mm[: len(b)], None))
    try:
        assert sealed.nbytes < 9 * 2**20 and len(sealed.extra_fds) == 1, sealed.nbytes
    finally:
        sealed.close()


@pytest.mark.unit
def test_what_still_cannot_cross_is_named_not_the_lambda():
    ds, _, collates = _local_parts()
    ds.guard = threading.Lock()
    dl = stoker.DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="spawn",
                           collate_fn=collates["lambda"])
    with pytest.warns(UserWarning), pytest.raises(TypeError) as e:
        list(dl)
    msg = str(e.value)
    assert "dataset.guard (a lock" in msg and "stoker.per_worker" in msg, msg
    assert "collate_fn" not in msg.split("stoker:")[1], msg


def test_a_checkpoint_of_a_by_value_loader_holds_no_code():
    """A loader whose dataset, sampler and collate_fn go by value checkpoints plain data: it loads
    with ``weights_only=True`` (which refuses any code) and resumes where it was."""
    import io

    ds, init, collates = _local_parts()

    class Backwards(torch.utils.data.Sampler):  # a local sampler with state of its own
        def __init__(self, n):
            self.n = n

        def __len__(self):
            return self.n

        def __iter__(self):
            return iter(range(self.n - 1, -1, -1))

    def make():
        return stoker.DataLoader(ds, batch_size=4, num_workers=2, sampler=Backwards(len(ds)),
                                 multiprocessing_context="forkserver",
                                 collate_fn=collates["lambda"])

    dl = make()
    it = iter(dl)
    head = [next(it).tolist() for _ in range(2)]
    buf = io.BytesIO()
    torch.save(dl.state_dict(), buf)
    del it
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    assert b"cloudpickle" not in buf.getvalue() and b"<lambda>" not in buf.getvalue()
    again = make()
    again.load_state_dict(state)
    assert head + [b.tolist() for b in again] == [b.tolist() for b in make()]


def _other_pythons() -> list[str]:
    """Interpreters of Python 3.12 or later on this machine (pyenv's, or on PATH), other than
    this one."""
    import glob
    import shutil

    found = set(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[2-9]*/bin/python3")))
    found |= {p for v in range(12, 20) if (p := shutil.which(f"python3.{v}"))}
    found = {os.path.realpath(p) for p in found if "/shims/" not in p}  # (pyenv's: the same)
    return sorted(found - {os.path.realpath(sys.executable)})


@pytest.mark.parametrize("python", _other_pythons())
def test_the_by_value_rules_on_another_python(tmp_path, python):
    """What depends on the interpreter (code objects, a class's ``__firstlineno__`` from 3.13,
    the start methods' rules), on each newer Python here, without torch: stoker's pickling of a
    local class, a lambda, a closure, a partial and a main-guarded class, loaded by forkserver
    and spawn children."""
    import shutil

    import cloudpickle

    (tmp_path / "rules").mkdir()  # stoker's two modules of the rules, as a package of their own
    (tmp_path / "rules" / "__init__.py").write_text("")
    for module in (_by_value, _main_script):
        shutil.copy(module.__file__, tmp_path / "rules")
    shutil.copy(os.path.join(HERE, "scenarios", "by_value_standalone.py"),
                tmp_path)
    # cloudpickle is pure Python: this environment's copy serves the other interpreter
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(cloudpickle.__file__)))
    env.pop("PYTHONHOME", None)
    r = subprocess.run([python, "by_value_standalone.py"], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["needed"] == [True, False, False], out
    for method in ("forkserver", "spawn"):
        assert out[f"{method}/local"] == ["AttributeError", [10, 11, 14, 19]], out
        # plain pickle takes it (by name), and the child would not find it
        assert out[f"{method}/guarded"] == ["pickles", [0, -1, -2, -3]], out


# -- stoker.per_worker ---------------------------------------------------------------------------

def _table(tmp_path, n: int = 32) -> str:
    path = str(tmp_path / "rows.db")
    with sqlite3.connect(path) as conn:
        conn.execute("create table t (k integer primary key, v integer)")
        conn.executemany("insert into t values (?, ?)", [(i, i * 11) for i in range(n)])
    return path


def _rows(ds, **kw) -> list:
    return torch.cat(list(stoker.DataLoader(ds, batch_size=4, **kw))).tolist()


@pytest.mark.parametrize("ctx", ["fork", "spawn", "forkserver"])
def test_a_per_worker_handle_is_each_workers_own(tmp_path, ctx):
    ds = Rows(_table(tmp_path))
    mine = ds.db  # the main process's, opened first: a forked worker must never use it
    with pytest.raises(TypeError):
        pickle.dumps(mine[1])  # what spawn could not carry without per_worker
    rows = _rows(ds, num_workers=2, multiprocessing_context=ctx)
    assert [v for v, _, _ in rows] == [i * 11 for i in range(32)]
    assert all(opener == loader != os.getpid() for _, opener, loader in rows), rows
    assert len({loader for _, _, loader in rows}) == 2
    assert ds.db is mine and mine[1].execute("select count(*) from t").fetchone() == (32,)


def test_a_per_worker_handle_in_the_main_process_and_after_a_restart(tmp_path):
    path = _table(tmp_path)
    rows = _rows(Rows(path), num_workers=0)
    assert all(opener == loader == os.getpid() for _, opener, loader in rows)
    ds = Rows(path, kill_at=13, marks=str(tmp_path / "killed"))
    dl = stoker.DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="spawn",
                           on_worker_death="restart")
    rows = torch.cat(list(dl)).tolist()
    assert [v for v, _, _ in rows] == [i * 11 for i in range(32)]  # each row once, in order
    assert all(opener == loader for _, opener, loader in rows), rows
    assert len(dl.deaths) == 1 and len({loader for _, _, loader in rows}) == 3


def test_a_per_worker_handle_in_the_node_pools_workers(tmp_path, monkeypatch):
    monkeypatch.setenv("STOKER_NODE_LINGER_S", "1")
    ds = Rows(_table(tmp_path))
    mine = ds.db  # opened here first: the pickle the pool gets holds no handle
    rows = _rows(ds, num_workers=2, placement=stoker.Node(workers=2, name=f"pw-{os.getpid()}"))
    assert [v for v, _, _ in rows] == [i * 11 for i in range(32)]
    assert all(opener == loader != os.getpid() for _, opener, loader in rows), rows
    assert ds.db is mine


@pytest.mark.unit
def test_per_worker_is_left_out_of_pickles_and_copies(tmp_path):
    ds = Rows(_table(tmp_path))
    assert not Rows.db.opened(ds)
    first = ds.db
    assert Rows.db.opened(ds) and ds.db is first
    for other in (pickle.loads(pickle.dumps(ds)), copy.deepcopy(ds)):
        assert not Rows.db.opened(other) and other.db is not first and other.db[1] is not None
    assert pickle.dumps(ds) == pickle.dumps(Rows(ds.path))  # the node pool's key is unchanged
    del ds.db
    assert not Rows.db.opened(ds) and ds.db is not first
    with pytest.raises(AttributeError, match="opened in each process"):
        ds.db = None


class _Shards:
    uris = ["a", "b", "c"]

    @stoker.per_worker
    def creds(self):
        return {"token": "t"}

    @stoker.per_worker
    def tables(self):  # opens its shards on threads, each of which needs the credentials
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(3) as ex:
            return list(ex.map(lambda u: (u, self.creds["token"]), self.uris))

    @stoker.per_worker
    def client(self):
        return self.log  # refers back to the dataset (a bound method)

    def log(self, message):
        pass


class _OwnState:
    @stoker.per_worker
    def creds(self):
        return {"token": "t"}

    def __getstate__(self):
        return self.__dict__


def _open_tables(ds, done: list) -> None:
    done.append(ds.tables)


@pytest.mark.unit
def test_per_worker_factories_on_threads_copies_and_garbage():
    """A factory that waits for threads using another per_worker attribute does not deadlock;
    a handle that refers back to its dataset is collected with it; a shallow copy opens its
    own."""
    import gc
    import weakref

    ds = _Shards()
    done = []
    t = threading.Thread(target=_open_tables, args=(ds, done), daemon=True)
    t.start()
    t.join(30)
    assert done == [[("a", "t"), ("b", "t"), ("c", "t")]]
    assert ds.client == ds.log
    other = copy.copy(ds)
    assert _Shards.tables.opened(ds) and not _Shards.tables.opened(other)
    own = _OwnState()  # its own __getstate__ copies the handle in its __dict__ too
    assert own.creds == {"token": "t"}
    own_copy = copy.copy(own)
    assert _OwnState.creds.opened(own) and not _OwnState.creds.opened(own_copy)
    assert own_copy.creds is not own.creds
    ref = weakref.ref(ds)
    del ds, other
    gc.collect()
    assert ref() is None


def test_a_lance_dataset_read_from_forked_workers(tmp_path):
    """pylance (a Rust runtime with threads of its own) opened and read in the main process, then
    read from forked workers through stoker.per_worker: each worker's own handle, every row, no
    hang (the scenario's time bound)."""
    pytest.importorskip("lance")
    r = run_ok("per_worker.read_under_fork", str(tmp_path / "rows.lance"), timeout=120)
    out = json.loads(r.stdout.strip().splitlines()[-2])  # the line before the runner's OK
    assert out["first"] == [21, out["main"], out["main"]] and out["again"][1] == out["main"]
    rows = out["rows"]
    assert [v for v, _, _ in rows] == [i * 7 for i in range(64)]
    assert all(opener == loader != out["main"] for _, opener, loader in rows), rows


def test_a_local_class_with_a_per_worker_handle_opened_here_crosses_by_value(tmp_path):
    """The class goes by value with its attributes: its per_worker descriptor goes without the
    handles it keeps."""
    path = _table(tmp_path)

    class LocalRows(torch.utils.data.Dataset):
        @stoker.per_worker
        def db(self):
            return os.getpid(), sqlite3.connect(path, check_same_thread=False)

        def __len__(self):
            return 8

        def __getitem__(self, i):
            opener, conn = self.db
            return torch.tensor([conn.execute("select v from t where k = ?", (i,)).fetchone()[0],
                                 opener, os.getpid()])

    ds = LocalRows()
    assert ds.db[0] == os.getpid()
    rows = _rows(ds, num_workers=2, multiprocessing_context="forkserver")
    assert [v for v, _, _ in rows] == [i * 11 for i in range(8)]
    assert all(opener == loader != os.getpid() for _, opener, loader in rows), rows
