"""The CUDA calls of the last mile, behind one small interface.

Everything stoker asks of a GPU goes through a ``Runtime``: page-lock a range of host memory and
let it go (``register``/``unregister``), events and streams, a copy to the device, a pinned copy
of a small tensor. ``TorchCuda`` does it with the CUDA runtime that torch loaded (the C++ core
never links CUDA or torch); CPU tests pass a fake with the same methods (tests/fake_cuda.py),
which is how the rules in docs/design/gpu.md are tested without a GPU.

The methods a runtime has:

- ``register(address, size) -> str | None``: page-locks the range (``cudaHostRegister``); None
  when it worked, else why not. ``unregister(address)``: ``cudaHostUnregister``.
- ``device(spec) -> object``: the device a spec names ("cuda", "cuda:1", a torch.device), with
  "cuda" read as the current device now.
- ``new_stream(device)``, ``current_stream(device)``, ``use_stream(stream)`` (a context manager:
  work queued inside goes to `stream`), ``wait(stream, event)`` (the stream waits for the event
  on the GPU; the CPU does not).
- ``record(stream) -> event`` with ``event.query() -> bool`` and ``event.synchronize()``.
- ``to_device(tensor, device)``: an asynchronous copy on the current stream;
  ``record_stream(tensor, stream)``: the caching allocator must not reuse its memory before the
  work queued on `stream` so far is done.
- ``pin(tensor)``: a copy in pinned memory (torch's caching host allocator: its blocks are
  reused, not allocated per batch).
- ``barrier() -> event``: an event that passes once all work queued so far *on every stream of
  every device this process uses* is done (the user may copy from a pinned batch on any stream,
  or to another GPU). ``TorchCuda`` runs ``torch.cuda.synchronize(device)`` on a helper thread
  for it, so the loop never waits; ``query()`` and ``synchronize()`` as for an event.

Thread contract: the thread that iterates (as torch's CUDA calls, per thread current stream).
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading

log = logging.getLogger("stoker")

# cudaHostRegisterPortable: the range is pinned for every CUDA context, not only the current one
_REGISTER_PORTABLE = 1


def runtime():
    """The real runtime when torch has CUDA and a GPU is there, else None."""
    try:
        import torch
    except ImportError:
        return None
    if getattr(torch.version, "hip", None):  # ROCm: torch's own pinning (a copy), not ours
        return None
    if not torch.cuda.is_available():
        return None
    return _TORCH_CUDA


class TorchCuda:
    """The CUDA runtime torch loaded: streams, events and copies through torch, page-locking
    through ``cudaHostRegister`` of the same libcudart (found among this process's mappings, so
    that a failed call's error can be cleared: otherwise torch would report it later as a kernel
    launch failure)."""

    def __init__(self):
        self._lib = None
        self._barriers = None

    def _cudart(self):
        if self._lib is None:
            import torch

            torch.cuda.init()
            self._lib = _loaded_cudart() or False
        return self._lib

    def register(self, address: int, size: int):
        lib = self._cudart()
        if not lib:
            import torch

            rc = int(torch.cuda.cudart().cudaHostRegister(address, size, _REGISTER_PORTABLE))
        else:
            rc = lib.cudaHostRegister(ctypes.c_void_p(address), ctypes.c_size_t(size),
                                      ctypes.c_uint(_REGISTER_PORTABLE))
        if rc == 0:
            return None
        return self._error(rc)

    def unregister(self, address: int) -> None:
        lib = self._cudart()
        if not lib:
            import torch

            rc = int(torch.cuda.cudart().cudaHostUnregister(address))
        else:
            rc = lib.cudaHostUnregister(ctypes.c_void_p(address))
        if rc != 0:
            log.warning("stoker: cudaHostUnregister failed (%s)", self._error(rc))

    def _error(self, rc: int) -> str:
        lib = self._lib
        if not lib:
            return f"CUDA error {rc}"
        lib.cudaGetLastError()  # clear it: nothing of torch's must see it
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        return f"CUDA error {rc}: {lib.cudaGetErrorString(ctypes.c_int(rc)).decode()}"

    # -- streams, events, copies: torch's -------------------------------------------------------
    def device(self, spec):
        import torch

        d = torch.device(spec)
        return d if d.index is not None else torch.device("cuda", torch.cuda.current_device())

    def new_stream(self, device):
        import torch

        return torch.cuda.Stream(device=device)

    def current_stream(self, device=None):
        import torch

        return torch.cuda.current_stream(device)

    def use_stream(self, stream):
        import torch

        return torch.cuda.stream(stream)

    def wait(self, stream, event) -> None:
        stream.wait_event(event)

    def record(self, stream):
        import torch

        event = torch.cuda.Event()
        event.record(stream)
        return event

    def to_device(self, tensor, device):
        return tensor.to(device, non_blocking=True)

    def record_stream(self, tensor, stream) -> None:
        tensor.record_stream(stream)

    def pin(self, tensor):
        return tensor.pin_memory()

    def barrier(self):
        import torch

        if self._barriers is None or self._barriers.pid != os.getpid():
            self._barriers = _Barriers()
        return self._barriers.new(torch.cuda.current_device())


class _Barrier:
    def __init__(self):
        self._done = threading.Event()

    def query(self) -> bool:
        return self._done.is_set()

    def synchronize(self) -> None:
        self._done.wait()


class _Barriers:
    """One helper thread: each round takes the barriers asked for so far, synchronises every
    device this process uses (the GIL is released while it waits), and passes them."""

    def __init__(self):
        self.pid = os.getpid()
        self._cv = threading.Condition()
        self._asked: list = []  # (barrier, device)
        threading.Thread(target=self._run, name="stoker-gpu-barrier", daemon=True).start()

    def new(self, device: int) -> _Barrier:
        """`device`: the asking thread's current device (the helper thread has its own)."""
        b = _Barrier()
        with self._cv:
            self._asked.append((b, device))
            self._cv.notify()
        return b

    def _run(self) -> None:
        import torch

        while True:
            with self._cv:
                while not self._asked:
                    self._cv.wait()
                batch, self._asked = self._asked, []
            try:
                for d in _devices_in_use(torch, {d for _, d in batch}):
                    torch.cuda.synchronize(d)
            except Exception as e:  # a sticky CUDA error: the user's loop sees it too
                log.warning("stoker: waiting for the GPU before handing slots back failed (%s)",
                            e)
            for b, _ in batch:
                b._done.set()


def _devices_in_use(torch, current: set) -> list[int]:
    """The askers' current devices and every device torch's allocator holds memory on (a copy
    there allocated it); synchronising any other would create a context on it."""
    return sorted(set(current) | {d for d in range(torch.cuda.device_count())
                                  if torch.cuda.memory_reserved(d) > 0})


def _loaded_cudart():
    """The libcudart this process has loaded (torch's), or None."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libcudart.so" in line}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        lib.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
        lib.cudaHostUnregister.argtypes = [ctypes.c_void_p]
        return lib
    return None


_TORCH_CUDA = TorchCuda()
