"""A fake ``CudaRuntime`` (stoker/loader/gpu/runtime.py) for CPU tests of the last mile.

It models what makes GPU copies dangerous: work is queued on streams and runs later, when the
test says so (``run()``), in an adversarial order (the default stream first, as far as its waits
allow), and a copy reads its source *when it runs*, by address, holding no reference to the
tensor, as a DMA engine does. So a slot handed back to its worker before the copy that reads it
has run shows up as wrong values, a consumer that did not wait for a copy's event reads the
device tensor before it was written, and unregistering memory that is no longer mapped fails.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes

import torch


class FakeEvent:
    def __init__(self, gpu):
        self._gpu = gpu
        self.done = False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self._gpu.run(until=self)


class FakeBarrier:
    def __init__(self, gpu, events):
        self._gpu, self._events = gpu, events

    def query(self) -> bool:
        return all(e.done for e in self._events)

    def synchronize(self) -> None:
        for e in self._events:
            self._gpu.run(until=e)


class FakeStream:
    def __init__(self, name: str):
        self.name = name
        self.ops = collections.deque()

    def __repr__(self):
        return f"<stream {self.name}>"


def _mapped(address: int) -> bool:
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= address < hi:
                return True
    return False


class FakeCuda:
    def __init__(self, refuse_register: bool = False):
        self.default = FakeStream("default")
        self.streams = [self.default]
        self.current = self.default
        self.registered: dict[int, int] = {}  # address -> size
        self.registrations = collections.Counter()
        self.unregistrations = 0
        self.device_tensors: dict[int, torch.Tensor] = {}  # id -> tensor made by to_device
        self.pinned_copies: list[tuple[int, int]] = []  # (address, nbytes) of pin() results
        self.waits: list[tuple[FakeStream, FakeEvent]] = []
        self.recorded_on: dict[int, list] = collections.defaultdict(list)
        self.refuse_register = refuse_register
        self.problems: list[str] = []

    # -- page-locking -----------------------------------------------------------------------------
    def register(self, address: int, size: int):
        if self.refuse_register:
            return "CUDA error 2: out of memory (fake)"
        if address in self.registered:
            self.problems.append(f"{address:#x} registered twice")
        self.registered[address] = size
        self.registrations[address] += 1
        return None

    def unregister(self, address: int) -> None:
        if address not in self.registered:
            self.problems.append(f"{address:#x} unregistered but not registered")
        elif not _mapped(address):
            self.problems.append(f"{address:#x} unmapped before it was unregistered")
        self.registered.pop(address, None)
        self.unregistrations += 1

    def is_pinned(self, t: torch.Tensor) -> bool:
        p, n = t.data_ptr(), t.numel() * t.element_size()
        ranges = list(self.registered.items()) + self.pinned_copies
        return any(a <= p and p + n <= a + s for a, s in ranges)

    # -- streams and events -----------------------------------------------------------------------
    def device(self, spec):
        return "fake-cuda:0"

    def new_stream(self, device):
        s = FakeStream(f"side{len(self.streams)}")
        self.streams.append(s)
        return s

    def current_stream(self, device=None):
        return self.current

    @contextlib.contextmanager
    def use_stream(self, stream):
        before, self.current = self.current, stream
        try:
            yield
        finally:
            self.current = before

    def wait(self, stream, event) -> None:
        self.waits.append((stream, event))
        stream.ops.append(("wait", event))

    def record(self, stream):
        ev = FakeEvent(self)
        stream.ops.append(("event", ev))
        return ev

    def to_device(self, tensor, device):
        assert tensor.is_contiguous(), "the fake copies contiguous tensors"
        out = torch.full(tensor.shape, -1, dtype=tensor.dtype)
        self.device_tensors[id(out)] = out
        nbytes = tensor.numel() * tensor.element_size()
        self.current.ops.append(("copy", out, tensor.data_ptr(), nbytes))
        return out

    def record_stream(self, tensor, stream) -> None:
        self.recorded_on[id(tensor)].append(stream)

    def barrier(self):
        """Passes once everything queued so far, on every stream, has run."""
        return FakeBarrier(self, [self.record(s) for s in self.streams])

    def pin(self, tensor):
        out = tensor.clone()
        self.pinned_copies.append((out.data_ptr(), max(1, out.numel() * out.element_size())))
        return out

    # -- what tests do with it --------------------------------------------------------------------
    def compute(self, fn) -> None:
        """The user's kernel on the current stream: `fn()` runs when the stream gets there."""
        self.current.ops.append(("call", fn))

    def run(self, max_ops: int | None = None, until: FakeEvent | None = None,
            only=None) -> int:
        """Runs queued work: the first stream (default first) whose next op can run, again and
        again; `only`: just these streams (the others are behind). Returns how many ops ran."""
        ran = 0
        streams = self.streams if only is None else only
        while max_ops is None or ran < max_ops:
            if until is not None and until.done:
                break
            stream = next((s for s in streams if s.ops and self._runnable(s.ops[0])), None)
            if stream is None:
                break
            self._execute(stream.ops.popleft())
            ran += 1
        if until is not None and not until.done:
            raise AssertionError("synchronize() on an event that can never complete")
        return ran

    def _runnable(self, op) -> bool:
        return op[0] != "wait" or op[1].done

    def _execute(self, op) -> None:
        kind = op[0]
        if kind == "event":
            op[1].done = True
        elif kind == "copy":
            _, out, src, nbytes = op
            if not _mapped(src):  # a real DMA would read freed memory
                self.problems.append(f"a copy read {src:#x}, which is no longer mapped")
                return
            ctypes.memmove(out.data_ptr(), src, nbytes)
        elif kind == "call":
            op[1]()
