"""What a worker's loop reports through: the endpoint a placement gives each ``WorkerLoop``.

A worker tells the main process everything through its endpoint: the messages of the wire
protocol (``protocol.py``), the batches it made, and its status (the sample it is on, for the
hang watch, ``stats()`` and ``stoker top``). The local placement's endpoint is the C++
``_stoker.WorkerEndpoint`` on the worker's channel (``process.py``); a Ray actor keeps one in
Python whose messages go back as its method call's result. ``Endpoint`` is what every endpoint
has; a ``ChannelEndpoint`` also reads the main process's messages (``WorkerLoop.serve`` needs
one; a placement that delivers messages itself calls ``WorkerLoop.handle`` and needs only an
``Endpoint``). ``tests/test_protocols.py`` checks each implementation against these, by type.

The loop passes every argument by position (the parameters are positional-only here), so an
implementation may name them as it likes; their number, order and defaults are the contract.

Thread contract: an endpoint has one caller, the worker thread that runs the dataset (its loop,
and before it the process's set-up); none is required to take concurrent calls, but for
``add_sample``, which the loading threads of ``threads_per_worker`` call too. The C++ one
releases the GIL while it waits in ``receive``, ``send`` and ``send_batch``. An endpoint whose
status another thread reads (an actor's status call) guards that status itself.
"""

from __future__ import annotations

from typing import Protocol


class Endpoint(Protocol):
    """Where a ``WorkerLoop`` sends what it has to say (see the module docstring)."""

    def send(self, type: int, task: int, a: int = 0, payload: bytes = b"", /) -> None:
        """One message to the main process: `type` a ``protocol.MSG_*``, `task` the task (for
        ``MSG_RESUMED``, the epoch) it is about, `a` a number whose meaning `type` gives (for
        ``MSG_SKIPPED``, 1 when the batch was dropped), `payload` its body, encoded by
        ``protocol.encode_*``. Messages reach the main process in the order they were sent.
        Raises ``EngineError`` when it cannot be sent (the main process is gone)."""

    def send_batch(self, task: int, obj: object, mode: int, indices: list | None = None,
                   /) -> bool:
        """`task`'s batch, laid out in shared memory and announced. `mode` a
        ``protocol.MODE_*``: with ``MODE_COLLATE`` or ``MODE_CONVERT`` `obj` is the list of
        samples, collated (or converted) on the way by the C++ fast path; with ``MODE_AS_IS``
        it is the finished batch. `indices`: a map-style batch's dataset indices (an encoding
        error names them), else None.

        Returns True once sent; False, having sent nothing, when the fast path declines the
        samples (a type it does not collate): the loop then collates them in Python and sends
        again with ``MODE_AS_IS``, which is never declined. May wait for room under the cap
        ``set_shared_memory_limit`` set, and raises ``SharedMemoryLimitError`` when none comes
        free in time; ``BatchEncodingError`` for an object that can be neither laid out nor
        pickled."""

    def enter(self, state: int, task: int, index: object, position: int = -1, /) -> None:
        """The worker is now in `state` (a ``protocol.STATE_*``) on `task`: `index` the dataset
        index of the sample it is on (None between samples; an index that is not an int is
        recorded as "not an int"), `position` that sample's place in the task's index list (-1:
        none), which names a sample whose index is not an int. Status only: sends no message
        and never blocks."""

    def add_sample(self, /) -> None:
        """One more sample fetched (the status's sample count). Thread-safe: the loading threads
        of ``threads_per_worker`` call it too."""

    def set_in_flight(self, n: int, /) -> None:
        """`n` samples load at once now (``threads_per_worker``; 0 when none, or one at a time).
        Status only."""

    def mark_ready(self, cpu_s: float, runqueue_s: float, /) -> None:
        """The worker is ready to serve: its CPU seconds and its threads' run-queue seconds
        now (``system.spent_so_far()``), which readers of its status subtract from what the
        kernel says of it (its start-up: imports, the dataset's unpickling, worker_init_fn,
        is not work; under spawn and forkserver, torch's import alone is about 2 s of CPU)."""

    def update_rss(self, /) -> None:
        """Refreshes the status's resident memory (the loop calls it after each task)."""

    def set_shared_memory_limit(self, cap_bytes: int, patience_s: float, /) -> None:
        """From now on this worker's batches together may take at most `cap_bytes` of shared
        memory (0: no cap); a batch that does not fit waits up to `patience_s` seconds for the
        user to let go of one (each slot that comes free starts the wait again). Called before
        the loop with the worker's share of ``max_shared_memory``, and on ``MSG_LIMIT`` when the
        number of workers sharing it changes."""


class ChannelEndpoint(Endpoint, Protocol):
    """An endpoint that also reads the main process's messages (``WorkerLoop.serve``)."""

    def receive(self, /) -> tuple[int, int, int, int, bytes] | None:
        """The next message from the main process, ``(type, task, a, b, payload)`` as
        ``WorkerLoop.handle`` takes it, waiting until one comes; None once the main process
        closed the channel. Raises ``EngineError`` when the channel fails."""
