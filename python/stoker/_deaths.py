"""Naming a worker's death in words a person can act on."""

from __future__ import annotations

import signal as _signal


def signal_name(signum: int) -> str:
    try:
        return _signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def describe_exit(exit_code: int, signum: int, core_dumped: bool) -> str:
    if signum:
        text = f"was killed by signal {signal_name(signum)}"
        desc = _signal.strsignal(signum)
        if desc:
            text += f" ({desc})"
        if core_dumped:
            text += ", core dumped"
        return text
    return f"exited with code {exit_code}"
