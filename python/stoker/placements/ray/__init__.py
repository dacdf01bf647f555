"""Ray actors: workers on a Ray cluster's nodes, behind the same ``Workers`` interface.

Four parts, each in its own module:

- ``actor.py``, what runs on the cluster: each worker is an actor that runs the same
  ``worker.loop.WorkerLoop`` over an endpoint of its own (``ActorEndpoint``); a message from
  the main process is one actor call, and what the loop sends back is that call's result. A
  batch is laid out by the same C++ encoder into one NumPy buffer, which Ray stores in its object
  store; the main process decodes it where it lies (``_stoker.decode_buffer``): its tensors are
  views of the object store's memory on this node (one network transfer when the actor ran on
  another node), and the object is released when the last view dies.
- ``record.py``, what the main process keeps of each actor: one ``ActorRecord`` per worker (its
  handle, its calls in the order sent, its status, its tasks waiting for room).
- ``room.py``, the room policy: each worker's share of ``max_shared_memory`` bounds the bytes its
  batches hold, with the same patience and the same ``SharedMemoryLimitError`` as a local
  worker's slots; and what the cluster's CPUs hold (a replacement that finds no room within
  ``Ray.start_timeout_s`` is a ``WorkerLost``: the iterator sends its work to the others; once
  the cluster has room a new actor starts and reports ``WorkerReady``).
- ``deaths.py``, the words for an actor's death: lost with its node, Ray's memory monitor, its
  process ended; a hang in the words every placement uses.

``workers.py`` composes them into ``RayWorkers``. The dataset is put in the object store once per
iterator and every actor gets a reference (each node fetches it once); ``shutdown`` kills every
actor, and actors also die with this process (they belong to its job).

Thread contract: ``RayWorkers``'s (``base.Workers``): the iterating thread calls everything
but the reads and ``shutdown``, which any thread may call.
"""

from .actor import ray_module
from .workers import RayWorkers

__all__ = ["RayWorkers", "ray_module"]
