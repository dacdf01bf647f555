"""What an iterator holds of the last mile: ``LastMile``, and ``last_mile()``, which decides.

``last_mile()`` gives an iterator its ``LastMile`` (None when it has nothing to do: no
``pin_memory``, no ``device``, or no CUDA for pinning). A ``LastMile`` composes the parts:
the pinned decoder (``pinning.py``), the hand-backs that wait for the user's copies
(``pin_memory``) or the stage that copies ahead (``device.py``), over one ``CudaRuntime``.
docs/design/gpu.md has the rules.

Thread contract: the thread that iterates; ``LastMile.close()`` from any thread.
"""

from __future__ import annotations

from ... import _stoker
from . import cuda
from .device import DeviceStage
from .pinning import HeldSlots, PinnedDecoder
from .runtime import CudaRuntime


class LastMile:
    """Between a worker's slot and the user: pinned decoding, slot hand-backs that wait for
    copies, and (with a device) the stage that copies ahead. Thread contract: the thread that
    iterates; ``close()`` from any thread."""

    def __init__(self, runtime: CudaRuntime, device_spec: str | None, pull):
        self.runtime = runtime
        self._held = None
        gate = None
        if device_spec is None:  # the user copies: hand-backs wait for what they queued
            gate = _stoker.ReleaseGate()
            self._held = HeldSlots(runtime, gate)
        self._decoder = PinnedDecoder(runtime, gate)
        self.stage = DeviceStage(runtime, device_spec, pull) if device_spec else None

    def decode(self, data):
        """The host batch of a ready batch, pinned."""
        return self._decoder.decode(data)

    def pending(self) -> bool:
        """Slots wait for copies (the loader must look again soon, also while it waits)."""
        if self._held is not None and self._held.pending():
            return True
        return self.stage is not None and self.stage.pending()

    def poll(self) -> None:
        if self._held is not None:
            self._held.poll()
        if self.stage is not None:
            self.stage.poll()

    def pinned_slots(self) -> int:
        return self._decoder.pinned_slots()

    def close(self) -> None:
        """Shutdown: every copy that reads a slot is waited for, slots go back and are
        unregistered."""
        if self.stage is not None:
            self.stage.finish_copies()
        if self._held is not None:
            self._held.close()
        self._decoder.close()


def last_mile(pin_memory: bool, device_spec: str | None, pull) -> LastMile | None:
    """The iterator's last mile: `pin_memory` as torch's iterator decided it (an accelerator is
    there), `device_spec` the ``device`` option, `pull` the iterator's next host batch."""
    if device_spec is None and not pin_memory:
        return None
    rt = cuda.runtime()
    if rt is None:
        if device_spec is not None:
            raise RuntimeError(
                f"stoker: device={device_spec!r} needs CUDA, but torch.cuda.is_available() is "
                "False here. Leave device=None on machines without a GPU.")
        return None  # pin_memory: torch's iterator already warned, and pins nothing
    return LastMile(rt, device_spec, pull)
