"""stoker's C++ engine: slots, channels, wire format and supervision."""



page_size: int = 4096

VIEW_MIN_BYTES: int = 65536

VIEW_SLOT_DIVISOR: int = 8

STATUS_FIELDS: tuple = ...

STATUS_PAGE_BYTES: int = 176

STATUS_MAGIC: int = 6004496033656295508

NO_INDEX: int = -9223372036854775808

WORKER_STATES: tuple = ...

STATE_STARTING: int = 0

STATE_IDLE: int = 1

STATE_FETCHING: int = 2

STATE_COLLATING: int = 3

STATE_ENCODING: int = 4

MSG_TASK: int = 1

MSG_RESUME: int = 2

MSG_STOP: int = 3

MSG_LIMIT: int = 4

MSG_SLOT_NEW: int = 10

MSG_SLOT_RETIRE: int = 11

MSG_BATCH: int = 12

MSG_ERROR: int = 13

MSG_END: int = 14

MSG_RESUMED: int = 15

MSG_HELLO: int = 16

MSG_STATUS_PAGE: int = 17

MSG_LOG_FILE: int = 18

MSG_SKIPPED: int = 19

MSG_ITER_STATE: int = 20

MESSAGE_TYPES: dict = ...

LOG_CRASH: int = 0

LOG_STDERR: int = 1

DTYPE_NAMES: tuple = ...

MODE_COLLATE: int = 0

MODE_CONVERT: int = 1

MODE_AS_IS: int = 2

def map_shared(fd: int, count: int, writable: bool = True) -> object:
    """
    An int64 array over a MAP_SHARED mapping of fd (count * 8 <= one page).
    """

def encode(obj: object | None, mode: int, indices: object | None = None) -> bytes: ...

def decode(data: bytes) -> object: ...

def encode_array(obj: object | None, mode: int, indices: object | None = None) -> object:
    """Encodes a batch into a new NumPy uint8 array (one copy)."""

def decode_buffer(buffer: object) -> object:
    """Decodes a batch in place, as views of `buffer` (kept alive by them)."""

class WorkerEndpoint:
    """A worker's end of its channel and its pool of slots."""

    def __init__(self, sock: int, worker_id: int) -> None: ...

    def arm_guard(self, parent_pid: int) -> None:
        """
        Die with the parent (PR_SET_PDEATHSIG) and when the main process closes the channel.
        """

    def receive(self) -> object: ...

    def send(self, type: int, task: int, a: int = 0, payload: bytes = ...) -> None: ...

    def send_batch(self, task: int, obj: object | None, mode: int, indices: object | None = None) -> bool: ...

    def set_shared_memory_limit(self, cap_bytes: int, patience_s: float) -> None:
        """
        Caps this worker's slots (0: no cap); a batch waits at most patience_s for room.
        """

    def open_status(self, loader_token: int = 0) -> None: ...

    def enter(self, state: int, task: int, index: object | None, position: int = -1) -> None: ...

    def add_sample(self) -> None: ...

    def set_in_flight(self, arg: int, /) -> None: ...

    def mark_ready(self, cpu_s: float, runqueue_s: float) -> None: ...

    def update_rss(self) -> None: ...

    def send_fd(self, type: int, a: int, fd: int) -> None: ...

    @property
    def slot_count(self) -> int: ...

    @property
    def mapped_bytes(self) -> int: ...

    @property
    def fd(self) -> int: ...

class SlotLease:
    """Keeps one batch's slot lent while any tensor view of it is alive."""

class HeldReleases:
    """
    Slot hand-backs taken from a gate, waiting for the copies that read the slots; handed back by release() or when this is dropped.
    """

    def release(self) -> None:
        """Hands the slots back to their workers."""

    def __len__(self) -> int: ...

class ReleaseGate:
    """Where the hand-back of a dead lease's slot waits (GPU copies)."""

    def __init__(self) -> None: ...

    def take(self) -> HeldReleases:
        """The hand-backs held since the last take()."""

    @property
    def held(self) -> int: ...

    def close(self) -> None:
        """Hands back what is held; nothing is held from now on."""

class MappedRegion:
    """A slot's mapping in this process, kept alive while this is held."""

    @property
    def address(self) -> int: ...

    @property
    def size(self) -> int: ...

    def sole(self) -> bool:
        """Nothing else holds the mapping any more."""

class PendingBatch:
    """A batch announced by a worker, not yet handed out."""

    def decode(self, gate: ReleaseGate | None = None) -> object:
        """
        Validates the slot and builds the batch as views of it; with a gate, the slot's hand-back waits there when the last view dies.
        """

    def region(self) -> MappedRegion:
        """The slot's mapping (for pinning it once)."""

    def discard(self) -> None:
        """Hands the slot back without building anything."""

    def lend(self) -> object:
        """
        Validates the slot and lends it without building anything: the slot stays the batch's until the returned SlotLease is dropped (the node pool holds it while ranks map the slot).
        """

    @property
    def fd(self) -> int:
        """
        The slot's memfd while this is held (-1 unless its Supervisor keeps slot fds).
        """

    @property
    def offset(self) -> int:
        """Where a batch begins in its slot (after the slot's header)."""

    @property
    def worker(self) -> int: ...

    @property
    def nbytes(self) -> int: ...

class Supervisor:
    """Watches workers: their channels and pidfds in one epoll set."""

    def __init__(self) -> None: ...

    def add_worker(self, worker: int, sock: int, pid: int) -> None: ...

    def remove_worker(self, worker: int) -> None: ...

    def has_worker(self, worker: int) -> bool: ...

    def keep_slot_fds(self) -> None:
        """
        Keeps each slot's memfd open from now on (PendingBatch.fd), to pass it on.
        """

    def send(self, worker: int, type: int, task: int, a: int = 0, payload: bytes = ..., b: int = 0) -> None: ...

    def wait(self, timeout: object | None = None) -> object: ...

    def status(self, worker: int) -> object: ...

    def read_log(self, worker: int, kind: int, max_bytes: int = 65536) -> str: ...

    def signal(self, worker: int, signum: int) -> None: ...

    def slot_usage(self) -> dict: ...

    def owned_fds(self) -> list[int]: ...

    @property
    def mapped_slot_count(self) -> int: ...

def channel_pair() -> tuple:
    """A connected SOCK_SEQPACKET pair (close-on-exec)."""

def encode_items(items: object, schemas: list, schema_ids: dict, dumps: object) -> tuple:
    """
    (data, int64 offsets) of items laid out for SharedItems; schemas grow with the dicts' key tuples.
    """

class SharedItems:
    """Items laid out by encode_items in a buffer, read as fresh objects."""

    def __init__(self, buffer: object, count: int, offsets_at: int, data_at: int, schemas: list, loads: object) -> None: ...

    def __len__(self) -> int: ...

    def __getitem__(self, key: object) -> object: ...
