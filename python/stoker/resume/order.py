"""What regenerates an epoch's sampler order: the loader's ``torch.Generator``s, torch's global RNG
at the sampler's first draw, and the sampler's epoch (``set_epoch``).

Pure functions of a loader; called by the thread that iterates it.
"""

from __future__ import annotations

import torch


def rng_bytes(state: torch.Tensor) -> bytes:
    """An RNG state (a uint8 tensor) as bytes: plain data in a checkpoint."""
    return state.numpy().tobytes()


def rng_tensor(b: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(b), dtype=torch.uint8)


def generators(loader) -> list:
    """(path, torch.Generator) for each distinct generator the loader's order depends on."""
    out, seen = [], set()
    bs = loader.batch_sampler
    for path, owner in (("generator", loader), ("sampler", loader.sampler),
                        ("batch_sampler", bs),
                        ("batch_sampler.sampler", getattr(bs, "sampler", None))):
        g = getattr(owner, "generator", None) if owner is not None else None
        if isinstance(g, torch.Generator) and id(g) not in seen:
            seen.add(id(g))
            out.append((path, g))
    return out


def capture_generators(loader) -> tuple:
    return tuple(rng_bytes(g.get_state()) for _, g in generators(loader))


def set_generators(loader, states) -> None:
    for (_, g), s in zip(generators(loader), states):
        g.set_state(rng_tensor(s))


def epoch_sampler(loader):
    """The sampler whose ``set_epoch`` decides the order (a DistributedSampler, say), or None."""
    bs = loader.batch_sampler
    for s in (getattr(bs, "sampler", None), bs, loader.sampler):
        if s is not None and hasattr(s, "set_epoch"):
            return s
    return None


def sampler_epoch(loader):
    s = epoch_sampler(loader)
    return getattr(s, "epoch", None) if s is not None else None
