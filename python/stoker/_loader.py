"""stoker.DataLoader: torch's DataLoader with stoker's engine underneath.

It *is* a ``torch.utils.data.DataLoader`` (a subclass), so argument checking, samplers, ``len()``,
``persistent_workers`` and every ``isinstance`` check in user code behave exactly as torch's.
``num_workers=0`` loads in the main process exactly as torch does. With workers, batches come
from stoker's multi-process iterator.
"""

from __future__ import annotations

import torch.utils.data

from ._iterator import MultiProcessIter


class DataLoader(torch.utils.data.DataLoader):
    __doc__ = (
        "A drop-in replacement for torch.utils.data.DataLoader: same arguments, same batches.\n\n"
        "Workers write batches into reusable shared-memory slots (no /dev/shm files, a handful "
        "of descriptors), batches arrive as zero-copy tensor views, and a worker that dies is "
        "named with its signal or exit code.\n\n" + (torch.utils.data.DataLoader.__doc__ or "")
    )

    def _get_iterator(self):
        if self.num_workers == 0:
            return super()._get_iterator()
        self.check_worker_number_rationality()
        return MultiProcessIter(self)
