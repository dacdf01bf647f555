"""Values torch's DataLoader delivers that stoker must deliver too, with the same types.

Each test runs torch.utils.data.DataLoader and stoker.DataLoader (two workers) on the same dataset
and compares what comes out; the wire-level tests check what the flat encoder and the decoder do
at their limits (nesting depth, corrupt strings and numbers in a slot).
"""

from __future__ import annotations

import struct

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import stoker
from stoker import _stoker
from support.compare import assert_same


class Samples(Dataset):
    """len(self) samples made by `make(i)` (a module-level function, so workers can run it)."""

    def __init__(self, make, n=4):
        self.make, self.n = make, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.make(i)


def both(make, n=4, **kwargs):
    """(torch's batches, stoker's batches) for the same dataset and arguments, two workers.
    torch's forks them: under spawn and forkserver (3.14's default) it cannot pickle the tests'
    local functions, which stoker's workers get by value."""
    theirs = list(DataLoader(Samples(make, n), num_workers=2,
                             **{"multiprocessing_context": "fork", **kwargs}))
    ours = list(stoker.DataLoader(Samples(make, n), num_workers=2, **kwargs))
    return theirs, ours


# --------------------------------------------------------------------------------------------
# Deep nesting: the flat encoder stops at 64 levels and pickles below; nothing is "corrupt".


def nested(i, depth=200):
    x = {"value": torch.full((2,), i), "name": f"s{i}"}
    for level in range(depth):
        x = [x] if level % 2 else {"down": x}
    return x


@pytest.mark.parametrize("batch_size", [None, 2])
def test_nesting_deeper_than_the_wire_limit_is_delivered(batch_size):
    theirs, ours = both(nested, batch_size=batch_size)
    assert_same(theirs, ours)


def test_deep_collate_fn_output_is_delivered():
    theirs, ours = both(nested, batch_size=2, collate_fn=lambda batch: batch)
    assert_same(theirs, ours)


@pytest.mark.unit
@pytest.mark.parametrize("depth", [62, 63, 64, 65, 66, 500])
@pytest.mark.parametrize("mode", ["MODE_AS_IS", "MODE_CONVERT"])
def test_every_depth_round_trips_through_the_wire(depth, mode):
    x = torch.arange(3)
    for _ in range(depth):
        x = [x]
    try:
        data = _stoker.encode(x, getattr(_stoker, mode))
    except stoker.common.errors.FallbackRequired:
        assert mode == "MODE_CONVERT"  # default_convert in Python handles the rest
        return
    assert_same(_stoker.decode(data), x)


# --------------------------------------------------------------------------------------------
# None as a whole sample or batch.


def none(i):
    return None


def test_none_samples_without_batching():
    theirs, ours = both(none, batch_size=None)
    assert theirs == ours == [None] * 4


def test_collate_fn_returning_none():
    theirs, ours = both(int, batch_size=2, collate_fn=lambda batch: None)
    assert theirs == ours == [None, None]


# --------------------------------------------------------------------------------------------
# Tensor subclasses keep the type torch gives them.


class Tagged(torch.Tensor):
    pass


def tagged(i):
    return torch.full((2, 3), float(i)).as_subclass(Tagged)


def parameter(i):
    return torch.nn.Parameter(torch.full((2,), float(i)), requires_grad=False)


@pytest.mark.parametrize("make", [tagged, parameter])
@pytest.mark.parametrize(
    "kwargs",
    [{"batch_size": 2}, {"batch_size": None}, {"batch_size": 2, "collate_fn": lambda b: b[1]}],
    ids=["default_collate", "default_convert", "collate_fn"],
)
def test_tensor_subclasses_keep_torchs_type(make, kwargs):
    theirs, ours = both(make, **kwargs)
    assert [type(b) for b in ours] == [type(b) for b in theirs]
    assert_same(theirs, ours)


def test_subclass_inside_a_structure_keeps_its_type():
    theirs, ours = both(lambda i: {"x": tagged(i), "y": [tagged(i), i]}, batch_size=2)
    assert_same(theirs, ours)


# --------------------------------------------------------------------------------------------
# Meta and nested tensors.


def meta(i):
    return {"weights": torch.empty(3, i + 1, device="meta"), "i": i}


@pytest.mark.parametrize("batch_size", [None, 1])
def test_meta_tensors(batch_size):
    theirs, ours = both(meta, batch_size=batch_size)
    for a, b in zip(theirs, ours):
        assert type(a["weights"]) is type(b["weights"])
        assert b["weights"].device.type == "meta"
        assert a["weights"].shape == b["weights"].shape and a["weights"].dtype == b["weights"].dtype
        assert_same(a["i"], b["i"])


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("layout", [torch.strided, torch.jagged])
def test_nested_tensors_without_batching(layout):
    def make(i):
        return torch.nested.nested_tensor([torch.arange(2.0) + i, torch.arange(3.0)], layout=layout)

    theirs, ours = both(make, batch_size=None)
    for a, b in zip(theirs, ours):
        assert type(a) is type(b) and a.is_nested and b.is_nested and a.layout == b.layout
        for x, y in zip(a.unbind(), b.unbind()):
            assert torch.equal(x, y)


def test_nested_tensors_with_default_collate_raise_torchs_error():
    def make(i):
        return torch.nested.nested_tensor([torch.arange(2.0), torch.arange(3.0)], layout=torch.jagged)

    # (torch's forks: it cannot pickle `make`, see `both`)
    for loader, kw in ((DataLoader, {"multiprocessing_context": "fork"}), (stoker.DataLoader, {})):
        with pytest.raises(RuntimeError, match="Batches of nested tensors are not currently"):
            list(loader(Samples(make), batch_size=2, num_workers=2, **kw))


# --------------------------------------------------------------------------------------------
# The encoder holds what it copies from: Python code it runs while walking a batch (a
# __reduce__) may drop the last other reference to a tensor it already walked.


class DropsTensor:
    """Pickling it empties its holder, freeing the tensor the encoder walked just before."""

    def __init__(self, holder):
        self.holder = holder

    def __reduce__(self):
        self.holder[0] = None
        return (int, (7,))


def file_backed(i, path, copy=False):
    # Memory from mmap: freed means unmapped, so reading it after the free faults every time.
    t = torch.from_file(path, shared=False, size=1 << 16, dtype=torch.uint8)
    holder = [t.clone() if copy else t]  # torch's workers cannot share a file-backed storage
    del t
    holder.append(DropsTensor(holder))
    return holder


def test_tensors_stay_alive_until_copied(tmp_path):
    path = str(tmp_path / "data.bin")
    with open(path, "wb") as f:
        f.write(bytes(range(256)) * 256)
    ours = list(stoker.DataLoader(Samples(_Bound(file_backed, path)), batch_size=2,
                                  num_workers=2, collate_fn=lambda batch: batch[0]))
    theirs = list(DataLoader(Samples(_Bound(file_backed, path, True)), batch_size=2,
                             num_workers=2, collate_fn=lambda batch: batch[0],
                             multiprocessing_context="fork"))  # (see `both`)
    assert_same(theirs, ours)
    assert ours[0][0][255] == 255 and ours[0][1] == 7


class _Bound:
    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __call__(self, i):
        return self.fn(i, *self.args)


# --------------------------------------------------------------------------------------------
# An exception that cannot be printed still reaches the main process, as with torch.


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("__str__ is broken too")


def raises_unprintable(i):
    raise Unprintable("bad sample")


def test_exception_whose_str_raises_is_reported():
    for loader in (DataLoader, stoker.DataLoader):
        with pytest.raises(Unprintable) as info:
            list(loader(Samples(raises_unprintable), batch_size=2, num_workers=2))
        text = info.value.args[0]
        assert "Caught Unprintable in DataLoader worker process" in text, (loader, text)
        assert "raises_unprintable" in text, (loader, text)


@pytest.mark.unit
def test_encode_error_survives_what_it_reports():
    from stoker.wire import protocol as _protocol

    class Local(Exception):  # a type pickle cannot find (nor the main process: it never sent it)
        def __str__(self):
            raise ValueError("no")

    class BadIndex:
        def __reduce__(self):
            raise TypeError("no pickle")

        def __repr__(self):
            raise TypeError("no repr")

    try:
        raise Local("x")
    except Local as e:
        report = _protocol.decode_error(_protocol.encode_error(e, 3, BadIndex()))
    assert report["type"] is None and report["type_name"].endswith("Local")
    assert "str() failed" in report["message"] or "unprintable" in report["message"]
    assert "test_encode_error_survives_what_it_reports" in report["traceback"]
    assert report["worker_id"] == 3 and isinstance(report["index"], str)


# --------------------------------------------------------------------------------------------
# Corrupt values in a slot are CorruptBatchError, never UnicodeDecodeError or ValueError.


def _corrupt(obj, old: bytes, new: bytes) -> bytes:
    data = _stoker.encode(obj, _stoker.MODE_AS_IS)
    assert data.count(old) == 1
    return data.replace(old, new)


@pytest.mark.unit
@pytest.mark.parametrize(
    "obj, old, new",
    [
        ("caf\u00e9-string", "caf\u00e9".encode(), b"caf\xff\xfe"),  # not UTF-8
        (2**70, str(2**70).encode(), b"1180591620717411303x24"),  # not a decimal number
        (-(2**70), str(-(2**70)).encode(), b"-" + b" " * 22),  # not a number at all
    ],
    ids=["str", "bigint", "bigint-blank"],
)
def test_corrupt_values_in_a_slot_are_corrupt_batches(obj, old, new):
    assert _stoker.decode(_stoker.encode(obj, _stoker.MODE_AS_IS)) == obj
    with pytest.raises(stoker.CorruptBatchError, match="corrupt batch in shared memory"):
        _stoker.decode(_corrupt(obj, old, new))


@pytest.mark.unit
def test_nesting_deeper_than_the_limit_in_a_slot_is_corrupt():
    """The decoder keeps its limit: the encoder never writes more than 64 levels."""
    data = bytearray(_stoker.encode([0] * 66, _stoker.MODE_AS_IS))
    _, _, node_count, _, _, nodes_offset = struct.unpack_from("<IIIIQQ", data)
    assert node_count == 67
    for k in range(66):  # 66 one-element lists around the last int
        struct.pack_into("<BBBBI", data, nodes_offset + 32 * k, 7, 0, 0, 0, 1)
    with pytest.raises(stoker.CorruptBatchError, match="nesting deeper than 64"):
        _stoker.decode(bytes(data))


# --------------------------------------------------------------------------------------------
# One source for facts both languages read: the extension exports them from the C++ definitions.


@pytest.mark.unit
def test_status_page_layout_comes_from_the_engine():
    from stoker.tools import top
    from stoker.wire import board as _board

    fields = _stoker.STATUS_FIELDS
    assert _stoker.STATUS_PAGE_BYTES == 8 * len(fields)
    assert len(set(fields)) == len(fields)
    assert fields[:3] == ("magic", "pid", "state") and fields[-4:] == (
        "position", "in_flight", "ready_cpu_ns", "ready_runqueue_ns")
    assert [f for f in fields if f.startswith("ns_")] == [
        "ns_" + s for s in _stoker.WORKER_STATES
    ]
    assert _board.STATUS_FIELDS is fields and top.STATUS_FIELDS is fields
    assert _board.STATES is _stoker.WORKER_STATES
    assert _stoker.WORKER_STATES[_stoker.STATE_FETCHING] == "loading"
    assert _board.STATUS_MAGIC == _stoker.STATUS_MAGIC and _board.NO_INDEX == -(2**63)


def test_a_live_status_page_reads_with_the_exported_fields():
    import os
    import time

    from stoker.tools import top

    loader = stoker.DataLoader(Samples(int, 8), batch_size=2, num_workers=2,
                               persistent_workers=True)
    assert len(list(loader)) == 4

    def is_this_loader(workers):
        return (sorted(w["id"] for w in workers) == [0, 1]
                and sum(w["samples"] for w in workers) == 8
                and sum(w["batches"] for w in workers) == 4
                and all(w["state"] == "idle" and w["rss_bytes"] > 0 for w in workers))

    # A worker writes "idle" on its page just after it sends its last batch: the loop may see
    # that batch first. Look again for a while (a bound against hangs, not a timing check).
    deadline = time.monotonic() + 10
    while True:
        mine = [entry["workers"] for entry in top.snapshot() if entry["pid"] == os.getpid()]
        if any(is_this_loader(workers) for workers in mine) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert any(is_this_loader(workers) for workers in mine), mine
    del loader


@pytest.mark.unit
def test_message_types_and_dtypes_come_from_the_engine():
    from stoker.wire import protocol as _protocol

    types = _stoker.MESSAGE_TYPES
    assert len(set(types.values())) == len(types)
    for name, value in types.items():
        assert getattr(_stoker, "MSG_" + name) == value
    assert _protocol.MSG_BATCH == types["BATCH"] and _protocol.MSG_TASK == types["TASK"]
    names = _stoker.DTYPE_NAMES
    assert len(set(names)) == len(names)
    for code, name in enumerate(names):  # every wire dtype is a torch dtype of that name
        t = torch.zeros(2, dtype=getattr(torch, name))
        out = _stoker.decode(_stoker.encode(t, _stoker.MODE_AS_IS))
        assert out.dtype == t.dtype, (code, name)


# --------------------------------------------------------------------------------------------
# Type stubs ship with the package and describe the extension as built.


def test_type_stubs_are_shipped_and_current(tmp_path):
    import os
    import subprocess
    import sys

    package = os.path.dirname(stoker.__file__)
    assert os.path.exists(os.path.join(package, "py.typed"))
    shipped = os.path.join(package, "_stoker.pyi")
    assert os.path.exists(shipped)
    nanobind = pytest.importorskip("nanobind.stubgen")
    del nanobind
    fresh = tmp_path / "_stoker.pyi"
    subprocess.run([sys.executable, "-m", "nanobind.stubgen", "-q", "-m", "stoker._stoker",
                    "-o", str(fresh)], check=True, env={**os.environ,
                                                       "PYTHONPATH": os.path.dirname(package)})
    with open(shipped) as f:
        assert f.read() == fresh.read_text(), (
            "python/stoker/_stoker.pyi is out of date: after building, run "
            "python -m nanobind.stubgen -q -m stoker._stoker -o python/stoker/_stoker.pyi")


@pytest.mark.unit
def test_a_batch_decoded_in_place_holds_its_buffer_while_views_live():
    """Views built on another owner's buffer (an object store's, for Ray workers) keep the
    buffer exported: its memory cannot be resized or freed under them."""
    import gc

    from stoker import _stoker

    batch = {"x": torch.arange(100_000, dtype=torch.float32), "y": torch.tensor([1, 2])}
    raw = bytearray(_stoker.encode_array(batch, 1).tobytes())
    out = _stoker.decode_buffer(raw)
    with pytest.raises(BufferError):
        raw.extend(b"more")  # would move the memory the views read
    assert torch.equal(out["x"], batch["x"])
    del out
    gc.collect()
    raw.extend(b"more")  # the last view is gone: the export with it
