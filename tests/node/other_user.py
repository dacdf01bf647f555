"""Two users of one job on one machine: `other_user.py DIR PORT`, run as root in a mount namespace
of its own (``unshare --mount``) by tests/placements/node/test_node.py.

A rank of root starts the job's pool and holds it; then a rank of uid 65534, with the same
MASTER_ADDR:MASTER_PORT (the same job), runs two epochs. Writes DIR/result.json with both
reports, the uids of the pools they were served by, and the return codes.

This machine's Python may live where uid 65534 cannot go (/root is 0700): before any rank starts,
every directory on the way to Python, stoker and the tests that the other user cannot enter is
covered, in this namespace only, by a tmpfs that can be entered, with the entries on the way bound
back into it. Nothing else changes: both ranks, their pools and the pools' workers are in this one
namespace, so their pools' names differ only by the uid.
"""

import json
import os
import stat
import subprocess
import sys
import tempfile
import time

import stoker

HERE = os.path.dirname(os.path.abspath(__file__))
NOBODY = 65534


def _blocked(path: str):
    """(directory, entry) of the first directory on the way to `path` that others cannot enter."""
    parts = os.path.abspath(path).split(os.sep)[1:]
    d = "/"
    for part in parts:
        if not os.stat(d).st_mode & stat.S_IXOTH:
            return d, part
        d = os.path.join(d, part)
    return None


def open_the_way(paths, stash_dir: str) -> None:
    for _ in range(16):
        found = {b for b in map(_blocked, paths) if b}
        if not found:
            return
        d = min(found)[0]
        entries = sorted({entry for dd, entry in found if dd == d})
        # inside the test's own folder (removed after it), not loose in the temp directory
        stash = tempfile.mkdtemp(prefix="way-", dir=stash_dir)
        subprocess.run(["mount", "--bind", d, stash], check=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "none", d], check=True)
        for entry in entries:
            os.mkdir(os.path.join(d, entry))
            subprocess.run(["mount", "--bind", os.path.join(stash, entry),
                            os.path.join(d, entry)], check=True)
    raise RuntimeError(f"could not open the way to {paths}")


def _env(port: int, pythonpath: str) -> dict:
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONPATH=pythonpath,
               OMP_NUM_THREADS="1", STOKER_NODE_LINGER_S="1", HOME="/tmp")
    env.pop("TORCHELASTIC_RUN_ID", None)
    return env


def _uid(pid: int):
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def main():
    out, port = sys.argv[1], int(sys.argv[2])
    pythonpath = os.environ.get("PYTHONPATH", "")
    open_the_way([sys.executable, sys.base_prefix, sys.prefix,
                  os.path.dirname(stoker.__file__), HERE, out], out)
    rank = [sys.executable, os.path.join(HERE, "rank.py")]
    holder = subprocess.Popen(rank + ["hold", os.path.join(out, "root"), "node"],
                              env=_env(port, pythonpath), cwd=out,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(out, "root.0.json")):
        if holder.poll() is not None or time.monotonic() > deadline:
            holder.kill()
            raise SystemExit(f"root's rank did not start: {holder.communicate()[1][-3000:]}")
        time.sleep(0.1)
    with open(os.path.join(out, "root.0.json")) as f:
        root = json.load(f)
    other = subprocess.run(rank + ["plain", os.path.join(out, "nobody"), "node"],
                           env=_env(port, pythonpath), cwd=out, user=NOBODY, group=NOBODY,
                           extra_groups=[], capture_output=True, text=True, timeout=150)
    result = {"root": root, "root_pool_uid": _uid(root["pool"]["pid"]),
              "root_pool_alive": _uid(root["pool"]["pid"]) is not None,
              "rc": other.returncode, "stderr": other.stderr[-3000:]}
    if other.returncode == 0:
        with open(os.path.join(out, "nobody.0.json")) as f:
            result["nobody"] = json.load(f)
    holder.kill()
    holder.wait()
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
