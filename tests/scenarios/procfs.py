"""What /proc says about a process, for scenarios that check what a loader leaves behind or
copies: its open descriptors and its private memory."""

from __future__ import annotations

import os


def open_fds(pid="self") -> int:
    """How many descriptors process `pid` holds open."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def private_kb(pid="self") -> int:
    """Process `pid`'s private memory, clean and dirty, in KiB (from smaps_rollup)."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return sum(int(line.split()[1]) for line in f
                   if line.startswith(("Private_Dirty", "Private_Clean")))
