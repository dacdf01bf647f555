"""A worker's loop: receive a task, load its samples, send the batch, whatever runs the worker.

Runs the user's dataset exactly as torch's worker loop does (same seeding, worker info, fetch and
collate semantics). What differs is what the worker tells the main process: the sample it is on
(``enter``), the samples it skipped, its state with each batch (stream_state.py), and its errors
with the dataset index.

``WorkerConfig`` is everything a worker needs, in one picklable object (it travels to the worker
by fork, spawn's pickle, or a placement's own transport). ``WorkerLoop`` talks to the main process
only through the ``Endpoint`` the placement provides (``endpoint.py`` says what each method
does); ``serve()`` reads messages from a ``ChannelEndpoint``, such as the local placement's C++
``_stoker.WorkerEndpoint`` (``process.py``).

Thread contract: a loop runs on one thread of its worker, the one that runs the dataset.
"""

from __future__ import annotations

import collections
import select
import sys
import threading
from dataclasses import dataclass, field
from typing import cast

from ..common import indices as _indices
from ..common import rng_state
from ..common import torch_compat as _torch_compat
from ..common.errors import SharedMemoryLimitError
from ..config import seeding
from ..config.load import LoadSettings
from ..datasets import worker_info as _info
from ..wire import protocol, stream_state
from ..wire.protocol import (
    MODE_AS_IS,
    MODE_COLLATE,
    MODE_CONVERT,
    MSG_END,
    MSG_ERROR,
    MSG_ITER_STATE,
    MSG_LIMIT,
    MSG_RESUME,
    MSG_RESUMED,
    MSG_SKIPPED,
    MSG_STOP,
    MSG_TASK,
)
from . import collate
from .endpoint import ChannelEndpoint, Endpoint
from .fetch import ITERABLE, MAP, AllSkipped, Loading, MapFetcher, StreamFetcher, fetcher_for

# How long a batch waits for the user to let go of shared memory under max_shared_memory before
# it fails with SharedMemoryLimitError; each slot that comes free starts the wait afresh.
SHARED_MEMORY_PATIENCE_S = 30.0


@dataclass
class WorkerConfig:
    """What every worker of one iterator is started with (the iterator refreshes it each epoch:
    the base seed and the seeder's epoch change)."""

    num_workers: int
    kind: int  # fetch.MAP or fetch.ITERABLE
    dataset: object
    auto_collation: bool
    collate_fn: object
    collate_mode: int  # protocol.MODE_*
    drop_last: bool
    base_seed: int
    init_fn: object = None  # worker_init_fn (a DataPipe's already wraps torch's sharding)
    # how samples load: the error policy, retries, threads_per_worker resolved (config/load.py;
    # a task re-issued after a death with samples in flight loads one by one: its serial word)
    load: LoadSettings = LoadSettings()
    shared_memory_share: int | None = None  # bytes this worker's batches may take (None: no cap)
    shared_seed: int | None = None  # an IterDataPipe's shuffle seed, the same in every worker
    seeder: seeding.SampleSeeder | None = None  # seed="per_sample"
    # A resumed (or restarted) worker: worker id -> the state it restores (stream_state.py:
    # its dataset's and stream's own states, its generators).
    stream_states: dict = field(default_factory=dict)
    # What multiprocessing's spawn tells a child of the process that made the dataset (its
    # sys.path, working directory, main module), for a worker started by another process:
    # the node pool's workers load a rank's dataset, whose classes may live in its script.
    prepare: dict | None = None
    # The standard output and error of the rank a node pool's worker loads for (two
    # fdpass.ChannelFd): what its dataset prints shows on that rank, not on the pool's.
    stdio: tuple | None = None

    @property
    def keeps_rng(self) -> bool:
        """Workers seeded by torch's rule draw from generators whose state a resume must put
        back; under seed="per_sample" every sample is seeded on its own."""
        return self.seeder is None


def _same(a, b) -> bool:
    """Whether two states are equal (a state holding tensors compares as changed)."""
    try:
        return bool(a == b)
    except Exception:  # a tensor's == is elementwise
        return False


class WorkerLoop:
    """One worker's loop over `endpoint`: ``prepare()`` once, then ``serve()`` (or ``handle()``
    for each message, when the placement delivers them)."""

    def __init__(self, endpoint: Endpoint, worker_id: int, config: WorkerConfig):
        self.endpoint = endpoint
        self.worker_id = worker_id
        self.config = config
        self.dataset = config.dataset
        self.task = 0  # the task being served (the status page names it)
        self.fetcher: MapFetcher | StreamFetcher | None = None
        self._loading: Loading | None = None  # the task whose samples load now
        self.init_error: Exception | None = None  # reported with the first task, as torch does
        self.ended = False  # an IterableDataset ran out: later tasks are ignored
        self.restored_ended = False  # resumed from a state taken after its stream ran out
        self._last_state = None  # the state sent last (an unchanged one is not sent again)
        self._rng = rng_state.Tracker() if config.keeps_rng else None
        self._thread = threading.get_ident()  # the one that writes the status page
        # messages read ahead (``_look_ahead``), handled next, in order; whether every one of them
        # is a task started ahead (else nothing more starts ahead until they are handled).
        # The loop owns what starts ahead: it reads the channel as its task's samples are done
        # (``_load``), and hands the fetcher the next task's samples to start.
        self._pending: collections.deque = collections.deque()
        self._started_ahead = True
        self._read_ahead = None  # a poll of the channel, under serve()

    # -- start -----------------------------------------------------------------------------------
    def prepare(self) -> None:
        """What torch's worker loop does before its first task: threads, seeds, worker info,
        worker_init_fn, the fetcher."""
        c = self.config
        if "torch" in sys.modules or c.collate_mode != MODE_AS_IS:
            try:
                import torch

                torch.set_num_threads(1)
                collate.stop_collate_from_using_shm()
            except ImportError:
                pass
        if "cv2" in sys.modules:
            try:
                sys.modules["cv2"].setNumThreads(0)
            except Exception:
                pass
        seed = seeding.seed_worker(c.base_seed, self.worker_id)
        if c.seeder is not None:
            c.seeder.worker_id = self.worker_id
        if c.shared_seed is not None:  # an IterDataPipe: one shuffle order for all workers
            self.dataset = _torch_compat.with_shared_seed(self.dataset, c.shared_seed)
        _info.set_worker_info(self.worker_id, c.num_workers, seed, self.dataset)
        try:
            if c.init_fn is not None:
                c.init_fn(self.worker_id)
            self.fetcher = self._new_fetcher(c.stream_states)
        except Exception as e:
            self.init_error = e

    def _on_sample(self, index, position, stream_pos) -> None:
        # From the loading threads of threads_per_worker too: the status page has one writer,
        # this thread, which entered "loading" for the whole batch (_on_batch); they only count.
        loading = self._loading
        if threading.get_ident() == self._thread and not (loading is not None and
                                                          loading.at_once):
            self.endpoint.enter(protocol.STATE_FETCHING, self.task, _indices.as_int(index),
                                -1 if position is None else position)
        self.endpoint.add_sample()
        seeder = self.config.seeder
        if seeder is not None:
            seeder(index, position, stream_pos)

    def _on_batch(self, index, in_flight: int | None) -> None:
        """A batch whose samples load at once, `in_flight` of them now: "loading" with no one
        index (a death or hang then holds the whole batch, which is re-issued one sample at a
        time to name it). `index` None: the batch is loaded (`in_flight` is 0). `in_flight`
        None: the threads' gate reports it (``on_running``: what loads ahead included)."""
        if index is not None:
            self.endpoint.enter(protocol.STATE_FETCHING, self.task, None)
        if in_flight is not None:
            self.endpoint.set_in_flight(in_flight)

    def _new_fetcher(self, states) -> MapFetcher | StreamFetcher:
        c = self.config
        # A resumed (or restarted) worker: its saved state back, in torchdata's order.
        mine = states.get(self.worker_id) if states else None
        stream_state.restore_dataset(self.dataset, mine)
        carried = None
        if self.fetcher is not None:  # a new epoch: the loop, threads and "auto" carry on
            carried = self.fetcher.inflight
            if carried is not None:
                carried.drop_ahead()  # (none is left: a new epoch's message stops looking ahead)
        f = fetcher_for(c.kind, self.dataset, c.auto_collation, c.drop_last, c.load,
                        self._on_sample, stream_state.position_of(mine),
                        on_batch=self._on_batch, carried=carried,
                        on_running=self.endpoint.set_in_flight)
        if isinstance(f, StreamFetcher):
            stream_state.restore_iterator(self.dataset, f.iterator, mine)
            self.restored_ended = stream_state.ended(mine)
        stream_state.restore_rng(mine)
        return f

    # -- the loop --------------------------------------------------------------------------------
    def serve(self) -> None:
        """Serves messages until the main process says stop or closes the channel; the
        endpoint must be a ``ChannelEndpoint`` (it has ``receive()`` and ``fd``). While a
        batch's last samples load on threads, the next tasks waiting in the channel start
        theirs (``_look_ahead``); every message is still handled in the order it came."""
        ep = cast(ChannelEndpoint, self.endpoint)
        self._read_ahead = select.poll()
        self._read_ahead.register(ep.fd, select.POLLIN)
        while True:
            if self._pending:
                msg = self._pending.popleft()
            else:
                ep.enter(protocol.STATE_IDLE, self.task, None)
                msg = ep.receive()
            if msg is None or not self.handle(*msg):
                break

    def _load(self, task: int, index, serial: bool):
        """Task `task`'s samples, under the policy (the fetcher's ``begin``, then its
        ``result``). While they load at once on threads, each time one is done and places at
        the gate are free, the loop looks ahead (``_look_ahead``) until nothing more may
        start."""
        assert self.fetcher is not None  # (made by prepare, before any task)
        loading = self._loading = self.fetcher.begin(index, task, serial)
        try:
            ahead = not serial
            for free in loading:
                if ahead and free > 0:
                    ahead = self._look_ahead()
            return loading.result()
        finally:
            self._loading = None

    def _look_ahead(self) -> bool:
        """Reads the next message if one waits; a task whose samples load at once on threads
        starts them now (the threads the batch loading now leaves free take them). False once
        nothing more may start ahead before the messages read are handled: a message of another
        kind, or a task that loads otherwise, keeps its place and what follows it waits."""
        ep = cast(ChannelEndpoint, self.endpoint)
        if self._read_ahead is None or (self._pending and not self._started_ahead):
            return False
        if not self._read_ahead.poll(0):
            return True  # nothing waits now: look again as the next sample is done
        msg = ep.receive()
        self._pending.append(msg)
        if msg is None or msg[0] != MSG_TASK:
            self._started_ahead = False
            return False
        t = protocol.decode_task(msg[2], msg[3], msg[4])
        f = self.fetcher
        if t.serial or not isinstance(f, MapFetcher) or not f.loads_at_once(t.index):
            self._started_ahead = False
            return False
        f.start_ahead(msg[1], t.index)
        self._started_ahead = True
        return True

    def handle(self, mtype: int, task: int, a: int, b: int, payload: bytes) -> bool:
        """One message from the main process (its words: channel.h), False for STOP. (A
        placement that delivers messages itself, an actor's method call, calls this
        directly.)"""
        if mtype == MSG_STOP:
            return False
        if mtype == MSG_RESUME:
            self._begin_epoch(task, payload)
        elif mtype == MSG_LIMIT:  # more (or fewer) workers share max_shared_memory now
            self.endpoint.set_shared_memory_limit(a, SHARED_MEMORY_PATIENCE_S)
        elif mtype == MSG_TASK and not self.ended:
            self.task = task
            self._thread = threading.get_ident()  # (an actor may serve on another thread)
            t = protocol.decode_task(a, b, payload)
            self._run_task(task, t.index, t.serial)
        return True

    def _begin_epoch(self, epoch: int, payload: bytes) -> None:
        # A new epoch may take a while (iter() of a stream, a restored state): "starting" tells
        # the main process this worker has taken its message and is busy with it.
        self.endpoint.enter(protocol.STATE_STARTING, self.task, None)
        self.ended = False
        self._last_state = None  # the new epoch's record starts empty: send the first one
        base_seed, shared, restore = protocol.decode_resume(payload)
        if shared is not None:  # an IterDataPipe: the new epoch's shuffle order
            self.dataset = _torch_compat.with_shared_seed(self.dataset, shared)
        if self.config.seeder is not None:
            self.config.seeder.begin_epoch(epoch, base_seed)
        if self.init_error is None:
            try:
                self.fetcher = self._new_fetcher(restore)
            except Exception as e:
                self.init_error = e
        self.endpoint.send(MSG_RESUMED, epoch)

    def _run_task(self, task: int, index, serial: bool = False) -> None:
        ep = self.endpoint
        if self.init_error is not None:
            ep.send(MSG_ERROR, task, 0, protocol.encode_error(self.init_error, self.worker_id, None))
            self.init_error = None
            return
        kind = self.config.kind
        try:
            if self.restored_ended:  # its stream had run out when the state was taken
                self.restored_ended = False
                raise StopIteration
            data = self._load(task, index, serial)
        except StopIteration as e:
            if kind == ITERABLE:  # the stream's end (fetch.py: for a map dataset, an error)
                self.ended = True
                self._send_stream_state(task, quiet=True, ended=True)
                self._report_skipped(task, dropped=False)
                ep.send(MSG_END, task)
                return
            ep.send(MSG_ERROR, task, 0, self._error(e))
            return
        except AllSkipped:
            if self._send_stream_state(task):
                self._report_skipped(task, dropped=True)
            return
        except Exception as e:
            self._send_stream_state(task, quiet=True)  # the stream continues after this error
            ep.send(MSG_ERROR, task, 0, self._error(e))
            return
        if not self._send_stream_state(task):
            return
        self._report_skipped(task, dropped=False)
        try:
            self._send(task, data, index if kind == MAP else None)
        except Exception as e:
            index = index if kind == MAP else None
            if self.config.load.on_error == "skip" and not isinstance(e, SharedMemoryLimitError):
                reason = f"collate failed: {type(e).__name__}: {protocol.safe_str(e)}"
                assert self.fetcher is not None
                self.fetcher.skip_all(index, reason)
                self._report_skipped(task, dropped=True)
            else:
                ep.send(MSG_ERROR, task, 0, protocol.encode_error(e, self.worker_id, index))
        del data
        ep.update_rss()

    # -- what goes back --------------------------------------------------------------------------
    def _send_stream_state(self, task: int, quiet: bool = False, ended: bool = False) -> bool:
        """The worker's state (stream_state.py), sent before the task's outcome (the main
        process pairs them) when it changed. False when it could not be taken: the task's
        outcome is then that error (a batch whose state is lost could not be resumed after);
        with `quiet`, a failure sends nothing (the outcome is an error anyway)."""
        f = self.fetcher
        stream = f if isinstance(f, StreamFetcher) else None
        try:
            state = stream_state.capture(self.dataset, stream.iterator if stream else None,
                                         stream.stream_pos if stream else None, self._rng,
                                         ended)
        except Exception as e:
            if quiet:
                return False
            err = RuntimeError(
                f"stoker: the dataset's state_dict() failed in worker {self.worker_id} "
                f"({type(e).__name__}: {protocol.safe_str(e)}). stoker takes it after every "
                "batch so that a checkpoint can resume each worker's stream, and a checkpoint "
                "holds only plain data; make state_dict() return such a dict (positions, "
                "seeds, names), or remove state_dict/load_state_dict from the dataset (a "
                "stream is then read again on resume, dropping the batches already received).")
            err.__cause__ = e
            self.endpoint.send(MSG_ERROR, task, 0, self._error(err))
            return False
        if state is not None and not _same(state, self._last_state):
            self._last_state = state
            self.endpoint.send(MSG_ITER_STATE, task, 0, protocol.encode_stream_state(state))
        return True

    def _report_skipped(self, task: int, dropped: bool) -> None:
        f = self.fetcher
        assert f is not None  # (a task's outcome: the fetcher loaded it)
        if f.skipped or dropped:
            self.endpoint.send(MSG_SKIPPED, task, 1 if dropped else 0,
                               protocol.encode_skipped(f.skipped))
            f.skipped = []

    def _error(self, exc) -> bytes:
        index = self.fetcher.current if self.fetcher is not None else None
        return protocol.encode_error(exc, self.worker_id, index)

    def _send(self, task: int, data, index) -> None:
        ep = self.endpoint
        mode = self.config.collate_mode
        indices = index if isinstance(index, list) else None
        if mode == MODE_AS_IS:
            ep.enter(protocol.STATE_COLLATING, task, None)
            out = self.config.collate_fn(data)
            ep.enter(protocol.STATE_ENCODING, task, None)
            ep.send_batch(task, out, MODE_AS_IS, indices)
            return
        ep.enter(protocol.STATE_ENCODING, task, None)
        if ep.send_batch(task, data, mode, indices):
            return
        # The fast path declined (an unusual type): torch's own collate decides, in Python.
        ep.enter(protocol.STATE_COLLATING, task, None)
        if mode == MODE_COLLATE:
            out = collate.collate_in_python(data)
        else:
            assert mode == MODE_CONVERT
            out = collate.convert_in_python(data)
        ep.enter(protocol.STATE_ENCODING, task, None)
        ep.send_batch(task, out, MODE_AS_IS, indices)
