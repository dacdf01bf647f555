"""What the last mile asks of a GPU: ``CudaRuntime``, and the ``CudaEvent`` it hands back.

Everything stoker does with CUDA goes through these methods: page-lock a range of host memory
and let it go, streams and events, a copy to the device, a pinned copy of a small tensor, and a
barrier across every stream. ``cuda.TorchCuda`` is the real runtime (torch's streams and events,
``cudaHostRegister`` from the libcudart torch loaded); CPU tests pass ``tests/fake_cuda.py``,
which runs queued work only when the test says, and so tests the rules of docs/design/gpu.md
without a GPU. ``tests/test_protocols.py`` checks both against these, by type.

Streams and devices are opaque here: whatever ``new_stream``/``current_stream`` and ``device``
return is only handed back to the same runtime.

Thread contract: the thread that iterates calls every method (as with torch's CUDA calls, the
current stream is per thread), except at shutdown, when any thread may call ``unregister``,
``barrier`` and an event's ``query``/``synchronize`` (the callers hold a lock around them, see
``pinning.py``).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol


class CudaEvent(Protocol):
    """A point in a stream's queued work (``record``), or in all of it (``barrier``)."""

    def query(self) -> bool:
        """True once the work queued before it is done. Never waits."""

    def synchronize(self) -> None:
        """Waits (the CPU) until ``query()`` would be True."""


class CudaRuntime(Protocol):
    """The CUDA calls of the last mile (see the module docstring)."""

    def register(self, address: int, size: int) -> str | None:
        """Page-locks host memory ``[address, address + size)`` for every CUDA context
        (``cudaHostRegister``, portable). None when it worked, else why not, in words (too much
        locked memory: ``ulimit -l``). A refusal must leave no CUDA error pending: torch would
        report it later, as a kernel's failure."""

    def unregister(self, address: int) -> None:
        """Lets go of a range ``register`` page-locked at `address` (``cudaHostUnregister``);
        the memory must still be mapped. A refusal is logged, not raised."""

    def device(self, spec) -> object:
        """The device `spec` names ("cuda", "cuda:1", a ``torch.device``), with "cuda" read as
        the calling thread's current device now."""

    def new_stream(self, device) -> object:
        """A new stream on `device` (one of ``device``'s results)."""

    def current_stream(self, device=None) -> object:
        """The calling thread's current stream on `device` (None: the current device)."""

    def use_stream(self, stream) -> AbstractContextManager:
        """A context manager: work queued inside it on this thread goes to `stream`."""

    def wait(self, stream, event: CudaEvent) -> None:
        """Work queued on `stream` from now on waits until `event` has passed: on the GPU, the
        CPU does not wait."""

    def record(self, stream) -> CudaEvent:
        """An event that passes once the work queued on `stream` so far is done."""

    def to_device(self, tensor, device):
        """A copy of host `tensor` on `device`, queued on the current stream and returned at
        once (asynchronous: `tensor`'s memory is read when the copy runs)."""

    def record_stream(self, tensor, stream) -> None:
        """The caching allocator must not reuse device `tensor`'s memory before the work queued
        on `stream` so far is done (``Tensor.record_stream``)."""

    def pin(self, tensor):
        """A copy of host `tensor` in pinned memory, from torch's caching host allocator (its
        blocks are reused, not allocated per batch)."""

    def barrier(self) -> CudaEvent:
        """An event that passes once all work queued so far *on every stream of every device
        this process uses* is done (a copy from a pinned batch may be on any stream, or to
        another GPU). Asking for it never waits; ``TorchCuda`` synchronises the devices on a
        helper thread."""
