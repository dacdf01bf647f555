"""What happens when a worker dies: raise at once, or restart it and re-issue its work, within a
restart budget; quarantine a sample that keeps killing workers; record skipped samples.

It decides from the death the placement named (``wire.events.WorkerExited``), whatever ran
the worker. Thread contract: used by the iterating thread only.
"""

from __future__ import annotations

import logging
import signal

from ...common.deaths import Death, signal_name
from ...common.indices import key
from ...config.records import SkippedSample

log = logging.getLogger("stoker")


def _torch_words(ex) -> str:
    """torch's own line for this death, after stoker's diagnosis: logs and code that search for
    torch's message (its test-suite does) still find it, while the first line, the one a person
    and a log search see, is stoker's (worker id, signal or exit code, dataset index)."""
    if ex.signum:
        return (f"(torch's words: DataLoader worker (pid {ex.pid}) is killed by signal: "
                f"{signal.strsignal(ex.signum)}.)")
    return f"(torch's words: DataLoader worker (pid(s) {ex.pid}) exited unexpectedly.)"


class Recovery:
    def __init__(self, records, options, num_workers: int, restartable: bool, stream_known=None):
        """`records`: the loader's (deaths, quarantine, skips); `restartable`: map-style, so a
        worker's work can be re-issued; `stream_known(worker_id)`: for an IterableDataset,
        whether a new worker can continue that worker's stream (the resume cursor knows)."""
        self._state = records
        self._opts = options
        self._restartable = restartable
        self._stream_known = stream_known
        self.budget = options.restart_budget(num_workers)
        self.restarts_by_worker = [0] * num_workers  # over the iterator's life (stats())
        self.new_epoch()

    def new_epoch(self) -> None:
        self.restarts = 0
        # dataset index -> deaths while loading it, this epoch: a poison sample kills its
        # worker again at once when re-issued, so one epoch is enough to see it, and two
        # unrelated deaths epochs apart do not add up.
        self._death_counts: dict = {}

    def on_exit(self, ex, tasks, indices, board, crashed):
        """Records the death `ex` (an ``wire.events.WorkerExited``) of a worker that held
        `tasks`. Raises what `crashed(death, indices, message)` returns when the policy says
        stop; returns normally when the worker is to be restarted and its tasks re-issued."""
        st = self._state
        death = Death(ex.worker, ex.pid, signal_name(ex.signum) if ex.signum else None,
                      ex.exit_code, ex.cause, ex.index, st.epoch, list(tasks),
                      starting=not ex.started)
        st.deaths.append(death)
        board.add("deaths")
        head = f"DataLoader worker {ex.worker} (pid {ex.pid}) {ex.explanation}\n{_torch_words(ex)}"
        if not ex.restartable and not ex.start_failed:  # its placement cannot start another
            raise crashed(death, indices, f"{head}\nA new worker would fail the same way: it "
                          "is not restarted.")
        if ex.start_failed:  # its own failure while starting: a new one would fail too
            raise crashed(death, indices,
                          f"DataLoader worker {ex.worker} (pid {ex.pid}) {ex.cause} while "
                          "starting, before it loaded anything; its traceback, if any, is "
                          "above on stderr. With 'spawn' or 'forkserver' the dataset and "
                          "collate_fn are pickled and the worker imports what they name: a "
                          "module it cannot import, or a class that exists only in this process "
                          "(patched in at run time), is not found there; define it in a module.")
        # Quarantine: a sample being loaded during `quarantine_after` deaths of one epoch is
        # poison. An unexplained SIGKILL counts too: a sample whose loading gets its worker killed
        # again when re-issued (by a watchdog reacting to it, say) is poison whoever sends the
        # signal, and kills unrelated to the sample do not land on it twice in a row.
        if ex.index is not None and (ex.busy or ex.hung):
            k = key(ex.index)
            count = self._death_counts.get(k, 0) + 1
            self._death_counts[k] = count
            if count >= self._opts.quarantine_after:
                if self._opts.on_error != "skip":
                    raise crashed(death, indices,
                                  f"{head}\nDataset index {ex.index!r} was being loaded during "
                                  f"{count} worker deaths this epoch: it is quarantined as "
                                  "poison. Pass on_error='skip' to skip it and go on, or fix "
                                  "the sample.")
                self.quarantine(ex.index, f"quarantined after {count} worker deaths ({ex.cause})",
                                board)
        if not ex.started:  # killed while starting (the OOM killer, an operator): it may
            head += "\nIt was killed while starting, before it loaded anything."  # start again
        if self._opts.on_worker_death == "raise":
            raise crashed(death, indices, head)
        if not self._restartable and not (self._stream_known and self._stream_known(ex.worker)):
            raise crashed(death, indices,
                          f"{head}\nstoker cannot restart a worker of an IterableDataset without "
                          "repeating or losing samples (its position in the stream died with it)."
                          " A dataset (or the iterator its __iter__ returns) with state_dict() "
                          "and load_state_dict() is restarted from its state.")
        if self.restarts >= self.budget:
            history = "\n".join(f"  - {d}" for d in st.deaths if d.epoch == st.epoch)
            raise crashed(death, indices,
                          f"{head}\nThat is {self.restarts + 1} worker deaths this epoch, over "
                          f"the budget of max_restarts={self.budget}. Deaths this epoch:\n"
                          f"{history}")
        self.restarts += 1
        self.restarts_by_worker[ex.worker] += 1
        board.add("restarts")
        log.warning(
            "stoker: DataLoader %s; restarted it (%d of %d restarts this epoch) and re-issued "
            "%d batch(es).", death, self.restarts, self.budget, len(tasks),
        )

    # -- quarantine and skips ------------------------------------------------------------------
    def any_quarantined(self) -> bool:
        return bool(self._state.quarantined)

    def is_quarantined(self, index) -> bool:
        return key(index) in self._state.quarantined

    def quarantine(self, index, reason: str, board) -> None:
        k = key(index)
        if k in self._state.quarantined:
            return
        self._state.quarantined.add(k)
        self.record_skip(index, reason, board)

    def record_skip(self, index, reason: str, board) -> None:
        board.add("skipped")
        self._state.record_skip(SkippedSample(index, reason, self._state.epoch))

