"""Datasets the node-placement ranks load (importable by the pool's workers)."""

import time

import torch


class Values(torch.utils.data.Dataset):
    """Sample i: its index and a random draw (seeded per sample under node placement, so the
    values say whether a sample was seeded as it would be with local workers). With `calls`,
    each __getitem__ appends its index to that file (counts loads across processes); with
    `slow_s`, each takes that long (the pool's workers are then always busy)."""

    def __init__(self, n=48, offset=0, calls=None, slow_s=0.0):
        self.n, self.offset, self.calls, self.slow_s = n, offset, calls, slow_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.slow_s:
            time.sleep(self.slow_s)
        if self.calls:
            with open(self.calls, "a") as f:
                f.write(f"{i}\n")
        return {"index": i + self.offset, "x": torch.rand(3) + i}


class CannotUnpickle(Values):
    """Its unpickling raises in the pool's workers (a file they cannot open, say): every start
    fails the same way."""

    def __setstate__(self, state):
        raise RuntimeError("cannot open the index of shard 0 in a pool worker")


class Counted(Values):
    """`Values` whose __getitem__ counts how many samples load at once across every process
    (`track`: a file holding "now max", updated under an flock), each taking `slow_s`."""

    def __init__(self, track, n=48, offset=0, slow_s=0.05):
        super().__init__(n=n, offset=offset, slow_s=0.0)
        self.track, self.hold_s = track, slow_s

    def _add(self, k: int) -> None:
        import fcntl

        with open(self.track, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.seek(0)
            now, most = (int(x) for x in (f.read().split() or ["0", "0"]))
            now += k
            f.seek(0)
            f.truncate()
            f.write(f"{now} {max(most, now)}")

    def __getitem__(self, i):
        self._add(1)
        try:
            time.sleep(self.hold_s)
            return super().__getitem__(i)
        finally:
            self._add(-1)


class WithList(Values):
    """`Values` that also holds a ``stoker.SharedList`` (each rank builds its own: the same
    items, another memfd)."""

    def __init__(self, calls=None):
        import stoker

        super().__init__(calls=calls)
        self.meta = stoker.SharedList({"k": k} for k in range(self.n))

    def __getitem__(self, i):
        out = super().__getitem__(i)
        out["index"] = self.meta[i]["k"]
        return out


class Prints(Values):
    """`Values` whose samples print which rank's dataset they come from."""

    def __init__(self, rank):
        super().__init__(offset=1000 * rank)
        self.rank = rank

    def __getitem__(self, i):
        # in pieces, as print writes its arguments, and many: each line reaches the rank whole
        for _ in range(20):
            print("PRINT", "-", self.rank, sep="", flush=True)
        return super().__getitem__(i)
