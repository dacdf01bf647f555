"""Machine limits a test imposes on a scenario: a private 16 MB /dev/shm (`TINY_SHM`, a command
prefix), where root and `unshare -m` allow it (`can_unshare`)."""

from __future__ import annotations

import os
import shutil
import subprocess


def can_unshare() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    r = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    return r.returncode == 0


TINY_SHM = ["unshare", "-m", "sh", "-c",
            'mount -t tmpfs -o size=16m tmpfs /dev/shm && exec "$@"', "sh"]
