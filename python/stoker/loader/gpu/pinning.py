"""Batches that arrive pinned: each slot page-locked once, not each batch copied.

A worker writes its batches into slots (shared memory the main process maps once and reuses).
``PinnedSlots`` page-locks each slot's mapping in the main process the first time a batch in it
is decoded (``cudaHostRegister``), so every later batch in that slot is a view of pinned memory:
``is_pinned()`` is true, ``.to("cuda", non_blocking=True)`` is a real asynchronous DMA, and
there is no per-batch copy, no pin thread and no ``cudaHostAlloc``. The registry holds each slot's
mapping (a ``MappedRegion``) while it is registered; a slot nobody else holds any more (its worker
retired or regrew it and no view is left) is unregistered, then let go (unmapped): never unmapped
while registered. One registry per runtime in the process, shared by every loader.

Small leaves are copied out of the slot when decoded (the view rule: holding a label must not keep
a slot lent); under pinning each such copy is made in pinned memory through torch's caching host
allocator, whose blocks are reused batch after batch.

``HeldSlots``: an asynchronous copy may still be reading a slot after the user dropped the last
view of it (``x = batch.to(dev, non_blocking=True); del batch``). torch's own pinned memory is
safe here because its allocator records an event for the copy; slot memory is not torch's, so
the slot's hand-back waits in a ``ReleaseGate``: the next time the loader looks (every batch, and
every few milliseconds while it waits), it asks the runtime for a barrier for the hand-backs that
arrived (work queued so far on every stream of every device in use is done: the copy may be on
a side stream or to another GPU), and hands the slots back once it has passed. The loop never
waits for it; slots wait about one training step longer before they go back.

Thread contract: the thread that iterates; ``close()`` from any thread (a registry has a lock).
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import weakref

from .runtime import CudaRuntime
from .tree import map_tensors

log = logging.getLogger("stoker")

SWEEP_EVERY = 16  # decodes between looks for slots to let go


class PinnedSlots:
    """The slots one iterator page-locked (each worker's slots are its own, so no two iterators
    share one)."""

    def __init__(self, runtime: CudaRuntime):
        self._rt = runtime
        self._regions: dict[int, object] = {}  # address -> MappedRegion
        self._refused = False
        self._since_sweep = 0
        self._closed = False
        self._lock = threading.Lock()  # close() may come from another thread (shutdown)
        _LIVE.add(self)

    def pin(self, region) -> bool:
        """Page-locks `region` unless it already is; False when CUDA refused (the batch is then
        pinned by a copy, and the reason logged once)."""
        address = region.address
        with self._lock:
            if address in self._regions:
                return True
            if self._closed:  # shut down (another thread): nothing new is registered
                return False
            err = self._rt.register(address, region.size)
            if err is None:
                self._regions[address] = region
                return True
        if not self._refused and err is not None:
            self._refused = True
            log.warning("stoker: cannot page-lock a %d-byte slot for the GPU (%s); batches are "
                        "pinned by a copy instead", region.size, err)
        return False

    def maybe_sweep(self) -> None:
        self._since_sweep += 1
        if self._since_sweep >= SWEEP_EVERY:
            self.sweep()

    def sweep(self) -> None:
        """Unregisters, then lets go of, every slot nobody else holds."""
        with self._lock:
            self._since_sweep = 0
            for address in [a for a, r in self._regions.items() if r.sole()]:
                self._rt.unregister(address)
                del self._regions[address]

    def close(self) -> None:
        """Unregisters every slot. Slots the user still holds views of are unregistered once
        the copies queued on the current stream are done; the views stay valid (mapped, no
        longer pinned) and the memory goes when they do."""
        self.sweep()
        with self._lock:
            self._closed = True
            if self._regions:
                self._rt.barrier().synchronize()
                for address in list(self._regions):
                    self._rt.unregister(address)
                self._regions.clear()

    def count(self) -> int:
        return len(self._regions)

    def forget(self) -> None:
        """In a forked child: the registrations are the parent's; only the mappings go."""
        self._regions = {}
        self._lock = threading.Lock()


_LIVE: weakref.WeakSet = weakref.WeakSet()


def _forget_in_child() -> None:
    for registry in list(_LIVE):
        registry.forget()


os.register_at_fork(after_in_child=_forget_in_child)


class HeldSlots:
    """Slot hand-backs that wait for the copies that may read them (see the module doc)."""

    def __init__(self, runtime: CudaRuntime, gate):
        self._rt = runtime
        self.gate = gate
        self._waiting = collections.deque()  # (barrier, HeldReleases), oldest first
        self._lock = threading.Lock()  # close() may come from another thread (shutdown)

    def pending(self) -> bool:
        return bool(self._waiting) or self.gate.held > 0

    def poll(self) -> None:
        with self._lock:
            if self.gate.held:
                self._waiting.append((self._rt.barrier(), self.gate.take()))
            w = self._waiting
            while w and w[0][0].query():
                w.popleft()[1].release()

    def close(self) -> None:
        """Shutdown (the workers are stopped first): what waits, and what the gate holds, goes
        back once the copies queued so far are done; from then on nothing waits."""
        with self._lock:
            w = self._waiting
            if self.gate.held:
                w.append((self._rt.barrier(), self.gate.take()))
            if w:
                w[-1][0].synchronize()  # the newest: every older one is done too
            while w:
                w.popleft()[1].release()
            self.gate.close()


class PinnedDecoder:
    """Decodes batches as pinned host tensors: slot views in page-locked slots, small leaves in
    pinned copies. `gate`: where slot hand-backs wait (None: the caller holds each batch until
    its copies are done, and slots go back when it lets go)."""

    def __init__(self, runtime: CudaRuntime, gate=None):
        self._rt = runtime
        self._slots = PinnedSlots(runtime)
        self._gate = gate
        self._copy_pin = None

    def decode(self, data):
        region = getattr(data, "region", None)
        if region is None:  # not in a slot of ours (an object store's buffer): torch's way
            return self._pin_by_copy(data.decode())
        region = region()
        pinned = self._slots.pin(region)
        self._slots.maybe_sweep()
        batch = data.decode(self._gate) if self._gate is not None else data.decode()
        if not pinned:
            return self._pin_by_copy(batch)
        lo, hi = region.address, region.address + region.size
        pin = self._rt.pin

        def leaf(t):
            p = t.data_ptr()
            return t if lo <= p < hi else pin(t)

        return map_tensors(batch, leaf, custom=_custom_pin)

    def _pin_by_copy(self, batch):
        return map_tensors(batch, self._rt.pin, custom=_custom_pin)

    def pinned_slots(self) -> int:
        return self._slots.count()

    def close(self) -> None:
        self._slots.close()


def _custom_pin(obj):
    return obj.pin_memory()
