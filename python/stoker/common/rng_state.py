"""The global random generators of a process (Python's ``random``, NumPy's legacy
``np.random``, torch's CPU generator) as plain, JSON-safe data, and back.

A worker seeded by torch's rule draws augmentation from these generators; their state after a
batch is what a resume (or a restarted worker) needs to draw what the uninterrupted run drew
next. A ``Tracker`` takes them raw (the hot path: after every batch); ``plain()`` turns that
into a dict of str and numbers (buffers in base64) that survives ``json.dumps``,
``torch.save(weights_only=True)`` and the checkpoint's digest; ``restore()`` puts it back; ``problem()`` says what is wrong with a state read from a checkpoint (None when it can be
restored), so a crafted one is refused before anything changes. A generator whose module was
never imported is left out (and left alone on restore).

A worker's ``Tracker`` takes them in about 15 us when they did not change (45 us when all three
did: NumPy's get_state is most of it); ``plain()`` costs about 10 us, paid only when a
checkpoint or a restart needs the state. Any thread, but the generators are the
process's: call them from the thread that loads samples.
"""

from __future__ import annotations

import base64
import ctypes
import random
import struct
import sys

_MT_WORDS = 625  # Python's Mersenne Twister: 624 words and the position


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


def _unb64(s: str) -> bytes:
    return base64.b64decode(s.encode("ascii"), validate=True)


class Tracker:
    """Takes the generators again and again (after every batch of a worker), paying the full
    price only for what changed: Python's state is read (~12 us), torch's (~1 us), and NumPy's
    Mersenne Twister words are looked at in place (<1 us) before its ``get_state`` (~30 us) is
    called. What did not change comes back as the very object returned before, so comparing
    two captures is cheap. One per process (the thread that loads samples)."""

    def __init__(self):
        self._py = None
        self._np = None
        self._np_raw = None
        self._np_where = None  # (the bit generator, the address of its words)
        self._torch = None

    def capture(self) -> tuple:
        version, words, gauss = random.getstate()
        packed = struct.pack(f"<{len(words)}I", *words)
        py = self._py
        if py is None or py[1] != packed or py[0] != version or py[2] != gauss:
            self._py = (version, packed, gauss)
        np = sys.modules.get("numpy")
        if np is not None:
            raw = self._numpy_words(np)
            # A cached Gaussian is used without moving the words: with one held, look again.
            if raw is None or raw != self._np_raw or self._np is None or self._np[3]:
                name, keys, pos, has_gauss, cached = np.random.get_state()
                self._np = (name, keys.astype("<u4").tobytes(), int(pos), int(has_gauss),
                            float(cached))
                self._np_raw = raw
        torch = sys.modules.get("torch")
        if torch is not None:
            t = torch.get_rng_state().numpy().tobytes()
            if t != self._torch:
                self._torch = t
        return (self._py, self._np if np is not None else None,
                self._torch if torch is not None else None)

    def _numpy_words(self, np) -> bytes | None:
        """NumPy's global MT19937 words and position as they lie in memory (None when that
        cannot be read: its full state is taken then)."""
        try:
            bg = np.random.mtrand._rand._bit_generator
            where = self._np_where
            if where is None or where[0] is not bg:
                where = self._np_where = (bg, bg.ctypes.state_address)
            return ctypes.string_at(where[1], 4 * 624 + 4)
        except Exception:
            return None


def plain(raw: tuple) -> dict:
    """What ``Tracker.capture()`` took, as JSON-safe data (what a checkpoint holds)."""
    (version, words, gauss), np_state, torch_state = raw
    out: dict = {"random": {"version": version, "state": _b64(words), "gauss": gauss}}
    if np_state is not None:
        name, keys, pos, has_gauss, cached = np_state
        out["numpy"] = {"name": name, "keys": _b64(keys), "pos": pos, "has_gauss": has_gauss,
                        "cached": cached}
    if torch_state is not None:
        out["torch"] = _b64(torch_state)
    return out


def restore(state: dict) -> None:
    """Puts `state` (from ``capture``, checked by ``problem``) back."""
    r = state.get("random")
    if r is not None:
        raw = _unb64(r["state"])
        words = struct.unpack(f"<{len(raw) // 4}I", raw)
        random.setstate((r["version"], words, r["gauss"]))
    n = state.get("numpy")
    np = sys.modules.get("numpy")
    if n is not None and np is not None:
        keys = np.frombuffer(_unb64(n["keys"]), dtype="<u4").astype(np.uint32)
        np.random.set_state((n["name"], keys, n["pos"], n["has_gauss"], n["cached"]))
    t = state.get("torch")
    torch = sys.modules.get("torch")
    if t is not None and torch is not None:
        torch.set_rng_state(torch.frombuffer(bytearray(_unb64(t)), dtype=torch.uint8))


def problem(state) -> str | None:
    """What is wrong with `state` as a generators' state (None when ``restore`` takes it)."""
    if not isinstance(state, dict) or not set(state) <= {"random", "numpy", "torch"}:
        return "a dict with 'random', 'numpy' and 'torch' states"
    try:
        r = state.get("random")
        if r is not None:
            raw = _unb64(r["state"])
            if (set(r) != {"version", "state", "gauss"} or len(raw) != 4 * _MT_WORDS
                    or not isinstance(r["version"], int)
                    or not (r["gauss"] is None or isinstance(r["gauss"], float))):
                return "Python's random state: its version, 625 words (base64) and gauss"
            words = struct.unpack(f"<{_MT_WORDS}I", raw)
            if words[-1] > 624:
                return "Python's random state with a position of at most 624"
        n = state.get("numpy")
        if n is not None:
            if (set(n) != {"name", "keys", "pos", "has_gauss", "cached"} or n["name"] != "MT19937"
                    or len(_unb64(n["keys"])) != 4 * 624 or not isinstance(n["pos"], int)
                    or not 0 <= n["pos"] <= 624 or n["has_gauss"] not in (0, 1)
                    or not isinstance(n["cached"], (int, float))):
                return "NumPy's MT19937 state: 624 keys (base64), pos, has_gauss, cached"
        t = state.get("torch")
        if t is not None:
            torch = sys.modules.get("torch")
            size = len(torch.get_rng_state()) if torch is not None else None
            if not isinstance(t, str) or (size is not None and len(_unb64(t)) != size):
                return f"torch's CPU generator state ({size} bytes, base64)"
    except (TypeError, ValueError, KeyError, AttributeError, struct.error):
        return "states as plain() writes them (base64 buffers)"
    return None
