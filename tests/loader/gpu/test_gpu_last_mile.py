"""The last mile to the GPU (stoker/loader/gpu/), tested without a GPU: tests/fake_cuda.py stands in for
the CUDA runtime. Its copies read their source by address when the fake GPU runs them, and it
runs queued work late and in an adversarial order, so a slot handed back before its copy ran,
or a batch used before its copy's event, shows up as wrong values; registering twice or
unmapping registered memory shows up in ``gpu.problems``."""

from __future__ import annotations

import logging
import os
import time
import warnings

import pytest
import torch

import scenario_datasets
import stoker
import stoker.loader.gpu.cuda
from fake_cuda import FakeCuda

N, B, WIDTH = 40, 4, 16384  # 10 batches of 4 x 64 KiB


def wide(n=N, **kw):  # the dataset, at this file's width
    return scenario_datasets.Wide(n, WIDTH, **kw)


@pytest.fixture
def gpu(monkeypatch):
    fake = FakeCuda()
    monkeypatch.setattr(stoker.loader.gpu.cuda, "runtime", lambda: fake)
    warnings.filterwarnings("ignore", "'pin_memory' argument is set", UserWarning)
    return fake


def loader(dataset=None, **kw):
    kw.setdefault("num_workers", 2)
    kw.setdefault("max_shared_memory", None)
    return stoker.DataLoader(dataset or wide(), batch_size=B, **kw)


def expected(batch_index):
    first = batch_index * B
    return torch.arange(first, first + B, dtype=torch.float32).repeat_interleave(WIDTH)


def consume(gpu, batches, run_every=None):
    """The training loop on the fake GPU: each batch is read by a kernel queued on the current
    stream (as the user's model would); the GPU runs every `run_every` batches (None: only at
    the end). Returns what the kernels saw, as [x (flat), y] per batch."""
    seen = []
    for k, b in enumerate(batches):
        gpu.compute(lambda x=b["x"], y=b["y"]: seen.append([x.flatten().clone(), y.tolist()]))
        if run_every and k % run_every == 0:
            gpu.run()
    gpu.run()
    return seen


def assert_batches(seen, first=0):
    for k, (x, y) in enumerate(seen, start=first):
        assert y == list(range(k * B, k * B + B)), f"batch {k} has labels {y}"
        assert torch.equal(x, expected(k)), f"batch {k} holds another batch's values"


# -- pin_memory=True: views of page-locked slots -------------------------------------------------
@pytest.mark.parametrize("persistent", [False, True])
def test_pinned_batches_are_views_of_slots_registered_once(gpu, persistent):
    ld = loader(pin_memory=True, persistent_workers=persistent)
    slots = 0
    for _ in range(2):
        for b in ld:
            assert gpu.is_pinned(b["x"]) and gpu.is_pinned(b["y"])
            p = b["x"].data_ptr()
            assert any(a <= p < a + s for a, s in gpu.registered.items()), "x was copied"
            assert not any(a <= b["y"].data_ptr() < a + s for a, s in gpu.registered.items())
            del b
        if not persistent:  # the epoch's workers went, their slots unregistered while mapped
            assert gpu.registered == {}
            assert set(gpu.registrations.values()) == {1}, "a slot was registered twice"
            slots += len(gpu.registrations)
            gpu.registrations.clear()  # the next epoch's slots may be mapped at the same place
    ld = None  # persistent workers go; every slot is unregistered while still mapped
    assert gpu.registered == {} and gpu.problems == []
    if persistent:  # the second epoch reused the first one's pinned slots
        assert set(gpu.registrations.values()) == {1}, "a slot was registered twice"
        slots = len(gpu.registrations)
    assert gpu.unregistrations == slots


def test_async_copy_of_a_dropped_batch_reads_that_batch(gpu):
    # x = batch.to("cuda", non_blocking=True); del batch: the copy still reads the slot later
    out = []
    for b in loader(pin_memory=True):
        out.append((gpu.to_device(b["x"], "cuda"), b["y"].tolist()))
        del b
    gpu.run()
    assert_batches([[x.flatten(), y] for x, y in out])
    assert gpu.problems == []


def test_async_copy_on_a_side_stream_of_a_dropped_batch_reads_that_batch(gpu):
    # The copy is queued on the user's own stream, not the one current when the loop asks for
    # the next batch (a hand-written prefetcher): the hand-back waits for every stream.
    side = gpu.new_stream(None)
    out = []
    for b in loader(pin_memory=True):
        with gpu.use_stream(side):
            out.append((gpu.to_device(b["x"], "cuda"), b["y"].tolist()))
        del b
        gpu.run(only=[gpu.default])  # the default stream keeps up, the side stream is behind
    gpu.run()
    assert_batches([[x.flatten(), y] for x, y in out])
    assert gpu.problems == []


class _SlowSync(FakeCuda):
    """A GPU that is behind: waiting for it takes a while (what a worker would use to write
    into a slot handed back too early)."""

    def barrier(self):
        b = super().barrier()
        sync = b.synchronize

        def slow():
            time.sleep(0.3)
            sync()

        b.synchronize = slow
        return b


@pytest.mark.parametrize("cap", [None, 3 << 20])
def test_shutdown_mid_epoch_waits_for_the_copies_before_slots_go_back(monkeypatch, cap):
    gpu = _SlowSync()
    monkeypatch.setattr(stoker.loader.gpu.cuda, "runtime", lambda: gpu)
    warnings.filterwarnings("ignore", "'pin_memory' argument is set", UserWarning)
    it = iter(loader(wide(400), pin_memory=True, max_shared_memory=cap, num_workers=1))
    out = []
    for _ in range(6):
        b = next(it)
        out.append(gpu.to_device(b["x"], "cuda"))
        del b
    it._shutdown_workers()  # as del it, or an exception leaving the loop
    gpu.run()
    assert [k for k, x in enumerate(out) if not torch.equal(x.flatten(), expected(k))] == []
    assert gpu.problems == [] and gpu.registered == {}


def test_the_fake_sees_the_race_the_gate_prevents(gpu):
    # The control: without the last mile (pin_memory=False) a dropped batch's slot goes back at
    # once and is rewritten before the late copy reads it. If this passed, the test above
    # could not fail.
    out = []
    for b in loader(pin_memory=False, num_workers=1):
        out.append(gpu.to_device(b["x"], "cuda"))
        del b
    gpu.run()
    wrong = [k for k, x in enumerate(out) if not torch.equal(x.flatten(), expected(k))]
    assert wrong or gpu.problems


def test_slots_stay_bounded_when_the_gpu_keeps_up(gpu):
    ld = loader(wide(n=400), pin_memory=True)
    seen = consume(gpu, ld, run_every=1)
    assert len(seen) == 100
    assert_batches(seen)
    # 2 workers use 6 slots without pinning here; the hand-backs that wait one step for their
    # event add at most one per batch in flight, however long the epoch
    assert len(gpu.registrations) <= 12, f"{len(gpu.registrations)} slots for 2 workers"
    assert gpu.problems == []


def test_refused_registration_pins_by_a_copy_with_one_warning(monkeypatch, caplog):
    gpu = FakeCuda(refuse_register=True)
    monkeypatch.setattr(stoker.loader.gpu.cuda, "runtime", lambda: gpu)
    warnings.filterwarnings("ignore", "'pin_memory' argument is set", UserWarning)
    with caplog.at_level(logging.WARNING, logger="stoker"):
        seen = consume(gpu, loader(pin_memory=True))
    assert_batches(seen)
    refusals = [r for r in caplog.records if "cannot page-lock" in r.getMessage()]
    assert len(refusals) == 1 and "out of memory" in refusals[0].getMessage()
    assert gpu.registered == {}


def test_pin_memory_without_cuda_is_torchs_one_warning(monkeypatch):
    monkeypatch.setattr(stoker.loader.gpu.cuda, "runtime", lambda: None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = [b["y"].tolist() for b in loader(pin_memory=True)]
    assert got == [list(range(k * B, k * B + B)) for k in range(N // B)]
    assert [str(w.message) for w in caught if "pin" in str(w.message)] == [
        "'pin_memory' argument is set as true but no accelerator is found, then device pinned "
        "memory won't be used."]


def test_enable_gives_torch_loaders_the_pinned_slots(gpu):
    stoker.enable()
    try:
        ld = torch.utils.data.DataLoader(wide(), batch_size=B, num_workers=2, pin_memory=True)
        seen = []
        for b in ld:
            assert gpu.is_pinned(b["x"])
            seen.append(gpu.to_device(b["x"], "cuda"))
            del b
    finally:
        stoker.disable()
    gpu.run()
    assert all(torch.equal(x.flatten(), expected(k)) for k, x in enumerate(seen))
    assert len(gpu.registrations) > 0 and gpu.registered == {} and gpu.problems == []


# -- device="cuda": copies ahead on a side stream ------------------------------------------------
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("run_every", [None, 1, 3])
def test_device_batches_hold_their_values_whatever_the_gpu_order(gpu, workers, run_every):
    seen = consume(gpu, loader(num_workers=workers, device="cuda"), run_every)
    assert_batches(seen)
    assert gpu.problems == []


def test_device_batches_are_copied_on_a_side_stream_and_waited_for(gpu):
    it = iter(loader(device="cuda"))
    b = next(it)
    side = [s for s in gpu.streams if s is not gpu.default]
    assert len(side) == 1
    assert id(b["x"]) in gpu.device_tensors and id(b["y"]) in gpu.device_tensors
    assert gpu.recorded_on[id(b["x"])] == [gpu.default]
    assert [s for s, _ in gpu.waits] == [gpu.default]
    assert any(op[0] == "copy" for op in side[0].ops) and side[0].ops[-1][0] == "event"
    # the consumer runs on another stream: the wait and record go there
    other = gpu.new_stream(None)
    with gpu.use_stream(other):
        b2 = next(it)
    assert gpu.waits[-1][0] is other and gpu.recorded_on[id(b2["x"])] == [other]
    del it
    gpu.run()
    assert gpu.problems == []


@pytest.mark.parametrize("workers", [0, 2])
def test_device_checkpoint_counts_only_batches_handed_out(gpu, workers):
    ld = loader(device="cuda", shuffle=False, num_workers=workers)
    it = iter(ld)
    first = [next(it) for _ in range(3)]  # the 4th is already being copied
    sd = ld.state_dict()
    assert sd["position"] == 3
    seen = consume(gpu, first)
    del it
    again = loader(device="cuda", shuffle=False, num_workers=workers)
    again.load_state_dict(sd)
    seen += consume(gpu, again)
    assert_batches(seen)


def test_device_error_is_raised_in_its_turn(gpu):
    it = iter(loader(wide(bad=17), device="cuda"))
    got = [next(it) for _ in range(4)]
    with pytest.raises(ValueError, match="cannot decode sample 17"):
        next(it)
    assert_batches(consume(gpu, got))
    del it


def test_device_worker_killed_is_restarted_and_its_batch_copied_again(gpu, tmp_path):
    ds = wide(die_at=13, marker=str(tmp_path / "died"))
    ld = loader(ds, device="cuda")
    seen = consume(gpu, ld)
    assert_batches(seen)
    assert os.path.exists(tmp_path / "died")
    assert [d.index for d in ld.deaths] == [13]


def test_device_with_pin_memory_copies_from_pinned_slots(gpu):
    seen = consume(gpu, loader(device="cuda", pin_memory=True))
    assert_batches(seen)
    assert gpu.registrations and gpu.registered == {} and gpu.problems == []


# -- the option -------------------------------------------------------------------------------------
@pytest.mark.unit
@pytest.mark.parametrize("bad", ["cpu", "cuda:x", 3, "gpu"])
def test_device_must_name_a_cuda_device(bad):
    with pytest.raises(ValueError, match="device"):
        stoker.DataLoader(list(range(8)), device=bad)


@pytest.mark.unit
def test_device_accepts_a_torch_device(gpu):
    ld = loader(device=torch.device("cuda", 0), num_workers=0)
    assert ld.options.device == "cuda:0"


@pytest.mark.unit
def test_device_without_cuda_says_so(monkeypatch):
    monkeypatch.setattr(stoker.loader.gpu.cuda, "runtime", lambda: None)
    with pytest.raises(RuntimeError, match="needs CUDA"):
        iter(loader(device="cuda", num_workers=0))


@pytest.mark.parametrize("workers", [0, 2])
def test_device_skips_are_recorded_as_their_batch_is_handed_out(gpu, workers):
    # batch 1 (indices 4..7) loses index 5; the checkpoint after batch 0 must not hold it
    def make():
        return loader(wide(bad=5), device="cuda", shuffle=False, num_workers=workers,
                      on_error="skip")

    ld = make()
    it = iter(ld)
    consume(gpu, [next(it)])  # batch 1 is already pulled and being copied
    sd = ld.state_dict()
    assert list(sd["skipped"]) == []
    del it
    again = make()
    again.load_state_dict(sd)
    rest = consume(gpu, again)
    assert [s.index for s in again.skipped] == [5]
    assert rest[0][1] == [4, 6, 7]
