"""Supervision for the multi-process iterator: waiting, deaths, restarts, quarantine, hangs.

A mixin of ``MultiProcessIter``: it uses the iterator's supervisor, processes, task table and
options. See docs/design/supervision.md.
"""

from __future__ import annotations

import logging
import signal
import time

from . import _cgroup, _deaths, _protocol, _worker
from ._errors import EngineError, WorkerCrashed, WorkerHung
from ._fetch import SkippedSample

log = logging.getLogger("stoker")

# How long to wait for a dead or stopped worker to be reaped.
_EXIT_GRACE_S = 1.0
# How often worker status pages are checked for hangs (at most).
_HANG_CHECK_S = 0.1


class Dropped:
    """Every sample of this task was skipped: no batch."""


class Supervision:
    # -- waiting -------------------------------------------------------------------------------
    def _wait(self):
        """The next message; deaths are handled (restart or raise) on the way."""
        timeout = self._timeout if self._timeout > 0 else None
        hang = self._opts["hang_timeout"]
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            slice_s = None
            if deadline is not None:
                slice_s = max(0.0, deadline - time.monotonic())
            if hang is not None:
                slice_s = _HANG_CHECK_S if slice_s is None else min(slice_s, _HANG_CHECK_S)
            ev = self._sup.wait(slice_s)
            if hang is not None:
                self._check_hangs(hang)
            if ev is None:
                if deadline is not None and time.monotonic() >= deadline:
                    self._raise_timeout()
                continue
            if ev[0] == "died":
                self._on_death(ev)
                if self._synthetic or self._restarted_in_reset:
                    return None  # the caller has something to look at now
                continue
            return ev

    def _check_hangs(self, hang_timeout: float) -> None:
        now = time.monotonic()
        if now - self._last_hang_check < _HANG_CHECK_S:
            return
        self._last_hang_check = now
        for w in range(self._num_workers):
            if w in self._hung or not self._sup.has_worker(w):
                continue
            st = self._sup.status(w)
            if not st or st["state"] not in ("loading", "collating"):
                continue
            if st["state_seconds"] > hang_timeout:
                stack = self._capture_stack(w)
                self._hung[w] = (st["index"], st["state_seconds"], stack)
                try:
                    self._sup.signal(w, signal.SIGKILL)
                except EngineError:
                    pass

    def _capture_stack(self, worker_id: int, wait_s: float = 1.0) -> str:
        """Asks the worker for its Python stack (faulthandler on DUMP_SIGNAL) and returns it."""
        before = self._sup.read_log(worker_id, _protocol.LOG_CRASH, 1 << 20)
        try:
            self._sup.signal(worker_id, _worker.DUMP_SIGNAL)
        except EngineError:
            return ""
        end = time.monotonic() + wait_s
        text = before
        while time.monotonic() < end:
            time.sleep(0.02)
            text = self._sup.read_log(worker_id, _protocol.LOG_CRASH, 1 << 20)
            if len(text) > len(before) and text.endswith("\n"):
                time.sleep(0.02)
                text = self._sup.read_log(worker_id, _protocol.LOG_CRASH, 1 << 20)
                break
        new = text[len(before):] if text.startswith(before) else text
        return _deaths.trim_stack(new.strip())

    def _raise_timeout(self):
        info = self._task_info.get(self._rcvd_idx)
        msg = f"DataLoader timed out after {self._timeout} seconds"
        if not info or len(info) != 1 or not self._sup.has_worker(info[0]):
            raise WorkerHung(msg, worker_id=None, pid=None, index=None, stack="")
        w = info[0]
        st = self._sup.status(w) or {}
        stack = self._capture_stack(w)
        pid = self._procs[w].pid if self._procs[w] is not None else None
        index = st.get("index")
        doing = st.get("state", "working")
        msg += (
            f": waiting for batch {self._rcvd_idx} from worker {w} (pid {pid}), which has been "
            f"{doing} for {st.get('state_seconds', 0):.1f} s"
            + (f" on dataset index {index!r}" if index is not None else "")
            + "."
        )
        if stack:
            msg += f"\nIts Python stack now:\n{stack}"
        msg += (
            "\nWhat to do: find what that sample waits on (I/O, a lock, a subprocess); raise "
            "timeout if it is legitimately slow, or set hang_timeout to restart such workers."
        )
        raise WorkerHung(msg, worker_id=w, pid=pid, index=index, stack=stack)

    # -- deaths --------------------------------------------------------------------------------
    def _on_death(self, ev) -> None:
        _, worker_id, exit_code, signum, core = ev
        proc = self._procs[worker_id]
        if worker_id in self._leaving:
            self._leaving.discard(worker_id)
            self._sup.remove_worker(worker_id)
            if proc is not None:
                proc.join(timeout=_EXIT_GRACE_S)
            return
        status = self._sup.status(worker_id) or {}
        crash_log = self._sup.read_log(worker_id, _protocol.LOG_CRASH, 1 << 16)
        stderr_tail = self._sup.read_log(worker_id, _protocol.LOG_STDERR, 8192)
        self._sup.remove_worker(worker_id)
        if proc is not None:
            proc.join(timeout=_EXIT_GRACE_S)
            # multiprocessing may have reaped it first (Process.start() reaps finished children),
            # in which case only it knows the status.
            if proc.exitcode is not None:
                signum, exit_code = (-proc.exitcode, None) if proc.exitcode < 0 else (0, proc.exitcode)
        pid = proc.pid if proc is not None else status.get("pid")
        hung = self._hung.pop(worker_id, None)
        busy = status.get("state") in ("loading", "collating", "encoding")
        index = hung[0] if hung else (status.get("index") if busy else None)
        oom_now = _cgroup.oom_kills()
        oom = signum == signal.SIGKILL and hung is None and any(
            b is not None and a is not None and a > b for a, b in zip(oom_now, self._oom_before)
        )
        self._oom_before = oom_now
        cause, explanation = _deaths.describe(
            signum, exit_code, core, oom=oom, rss=status.get("rss_bytes"), index=index,
            crash_log=crash_log, stderr_tail=stderr_tail,
            hung=(hung[1], hung[2]) if hung else None,
        )
        tasks = sorted(t for t, info in self._task_info.items()
                       if len(info) == 1 and info[0] == worker_id)
        death = _deaths.Death(worker_id, pid, _deaths.signal_name(signum) if signum else None,
                              None if signum else exit_code, cause, index, self._state.epoch, tasks)
        self._state.deaths.append(death)
        self._board.add("deaths")

        def crashed(message):
            self._shutdown_workers()
            return WorkerCrashed(
                message, worker_id=worker_id, pid=pid, signal=death.signal,
                exit_code=death.exit_code, cause=cause, indices=self._indices_of(tasks, index),
            )

        head = f"DataLoader worker {worker_id} (pid {pid}) {explanation}"
        if not status and hung is None:
            # It died before it could report anything: a start-up failure (its dataset could
            # not be unpickled under spawn, an import failed...). Restarting would fail alike.
            raise crashed(
                f"DataLoader worker {worker_id} (pid {pid}) {cause} while starting, before it "
                "loaded anything; its traceback, if any, is above on stderr. With 'spawn' or "
                "'forkserver' the dataset and collate_fn are pickled and the worker imports "
                "them again: classes defined in __main__ of an interactive session or "
                "`python -c` cannot be found there; define them in a module."
            )
        # Quarantine: a sample in flight during `quarantine_after` deaths is poison.
        if index is not None and (busy or hung):
            key = _key(index)
            count = self._state.death_counts.get(key, 0) + 1
            self._state.death_counts[key] = count
            if count >= self._opts["quarantine_after"]:
                if self._opts["on_error"] != "skip":
                    raise crashed(
                        f"{head}\nDataset index {index!r} was being loaded during {count} worker "
                        "deaths: it is quarantined as poison. Pass on_error='skip' to skip it and "
                        "go on, or fix the sample."
                    )
                self._quarantine(index, f"quarantined after {count} worker deaths ({cause})")
        if self._opts["on_worker_death"] == "raise":
            raise crashed(head)
        if self._kind != _worker.MAP:
            raise crashed(
                f"{head}\nstoker cannot restart a worker of an IterableDataset without repeating or "
                "losing samples (its position in the stream died with it)."
            )
        budget = self._opts["max_restarts"]
        if budget is None:
            budget = 3 * self._num_workers
        if self._restarts >= budget:
            history = "\n".join(f"  - {d}" for d in self._state.deaths if d.epoch == self._state.epoch)
            raise crashed(
                f"{head}\nThat is {self._restarts + 1} worker deaths this epoch, over the budget "
                f"of max_restarts={budget}. Deaths this epoch:\n{history}"
            )
        self._restarts += 1
        self._restarts_by_worker[worker_id] += 1
        self._board.add("restarts")
        self._restart(worker_id, tasks)
        log.warning(
            "stoker: DataLoader worker %d (pid %s) %s%s; restarted it (%d of %d restarts this "
            "epoch) and re-issued %d batch(es).", worker_id, pid, cause,
            f" while loading dataset index {index!r}" if index is not None else "",
            self._restarts, budget, len(tasks),
        )

    def _restart(self, worker_id: int, tasks: list) -> None:
        self._start_worker(worker_id)
        if self._resetting:
            self._restarted_in_reset.add(worker_id)
        for task in tasks:  # in their original order: results keep their places
            index = self._without_quarantined(task, self._task_index[task])
            self._task_index[task] = index
            if index is Dropped:
                self._arrived(task, Dropped())
            else:
                self._send_task(worker_id, task, index)

    def _quarantine(self, index, reason: str) -> None:
        key = _key(index)
        if key in self._state.quarantined:
            return
        self._state.quarantined.add(key)
        self._record_skip(index, reason)

    def _record_skip(self, index, reason: str) -> None:
        self._board.add("skipped")
        self._state.record_skip(SkippedSample(index, reason, self._state.epoch))

    def _indices_of(self, tasks, index):
        if index is not None:
            return [index]
        out = []
        for t in tasks:
            ix = self._task_index.get(t)
            if isinstance(ix, list):
                out.extend(ix)
            elif ix is not None and ix is not Dropped:
                out.append(ix)
        return out

def _key(index):
    try:
        hash(index)
        return index
    except TypeError:
        return repr(index)


def _hashable_in(index, bad: set) -> bool:
    return _key(index) in bad
