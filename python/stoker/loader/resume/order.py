"""What regenerates an epoch's sampler order: the loader's ``torch.Generator``s, torch's global RNG
at the sampler's first draw, the sampler's epoch (``set_epoch``), and the own state of a sampler
or batch sampler that has one (torchdata's ``Stateful`` protocol: a sampler drawing from its own
NumPy generator, say).

Pure functions of a loader; called by the thread that iterates it.
"""

from __future__ import annotations

import torch

from ...common.plain import to_plain
from ...wire.stream_state import stateful


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


def _samplers(loader) -> list:
    """(path, sampler) for each distinct sampler object of the loader."""
    out, seen = [], set()
    bs = loader.batch_sampler
    for path, s in (("sampler", loader.sampler), ("batch_sampler", bs),
                    ("batch_sampler.sampler", getattr(bs, "sampler", None))):
        if s is not None and id(s) not in seen:
            seen.add(id(s))
            out.append((path, s))
    return out


def stateful_samplers(loader) -> list:
    """(path, sampler) for the samplers that keep their own state (``Stateful``)."""
    return [(p, s) for p, s in _samplers(loader) if stateful(s)]


def capture_sampler_states(loader) -> dict:
    """{path: state} of the loader's stateful samplers, as plain data."""
    return {p: to_plain(s.state_dict(), f"the {p}'s state_dict()")
            for p, s in stateful_samplers(loader)}


def set_sampler_states(loader, states: dict) -> None:
    for p, s in stateful_samplers(loader):
        if p in states:
            s.load_state_dict(states[p])
