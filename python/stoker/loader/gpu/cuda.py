"""The last mile's real CUDA runtime, ``TorchCuda``, and ``runtime()``: whether there is one.

``TorchCuda`` implements ``runtime.CudaRuntime`` (the methods and what each must do) with the
CUDA runtime that torch loaded: torch's streams, events and copies, and page-locking through
``cudaHostRegister`` of the same libcudart (the C++ core never links CUDA or torch). Its
``barrier()`` runs ``torch.cuda.synchronize(device)`` on a helper thread, for every device this
process uses, so the loop never waits.

Thread contract: ``CudaRuntime``'s (the thread that iterates; ``unregister``, ``barrier`` and
its events' methods also at shutdown, from any thread: the barriers' helper takes asks under a
lock).
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading

from .runtime import CudaRuntime

log = logging.getLogger("stoker")

# cudaHostRegisterPortable: the range is pinned for every CUDA context, not only the current one
_REGISTER_PORTABLE = 1


def runtime() -> CudaRuntime | None:
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
    """A ``CudaRuntime``: streams, events and copies through torch, page-locking through
    ``cudaHostRegister`` of the libcudart torch loaded (found among this process's mappings, so
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
    """A ``CudaEvent`` that passes when the barriers' helper thread has synchronised."""

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
