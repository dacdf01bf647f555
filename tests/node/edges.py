"""Edge cases of a rank, each run in a fresh interpreter by tests/placements/node/test_node.py:
`edges.py CASE NAME` prints one JSON line.

- helper_exits: the rank forks a helper mid-epoch that exits normally (its exit hook runs);
  the rank's epoch goes on to its end (nothing of the rank's is ended by the helper);
- many_fds: the rank holds 1,100 open descriptors when it starts the pool (the pool, a fork,
  keeps their numbers: none may need select());
- sigchld_ignored: the rank ignores SIGCHLD (the kernel reaps its children) when it starts it.
"""

import json
import os
import signal
import sys

import torch

import stoker

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from node_datasets import Values  # noqa: E402


def main(case: str, name: str) -> None:
    held = []
    if case == "many_fds":
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
        held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    if case == "sigchld_ignored":
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    dl = stoker.DataLoader(Values(n=48), batch_size=4, num_workers=2,
                           placement=stoker.Node(workers=2, name=name))
    out = {"epochs": []}
    for _ in range(2):
        got = []
        for step, b in enumerate(dl):
            got += b["index"].tolist()
            if case == "helper_exits" and step == 2 and not out.get("helper"):
                pid = os.fork()
                if pid == 0:
                    sys.exit(0)  # its exit hook runs: it must end nothing of the rank's
                out["helper"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        out["epochs"].append(sorted(got))
    for fd in held:
        os.close(fd)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    torch.manual_seed(0)
    main(sys.argv[1], sys.argv[2])
