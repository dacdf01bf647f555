"""One pool of workers per machine, serving every rank of a job (``placement=stoker.Node()``).

Four parts, each in its own module (docs/design/node.md has the whole picture, the threads and
the threat model):

- ``wire.py``: the connection between a rank and the pool (an abstract Unix socket named for
  the user and the job, peer credentials checked on both sides, descriptors passed beside the
  messages);
- ``rendezvous.py``: which job a process belongs to, and a connection to its pool, started when
  there is none;
- ``pool.py`` and ``group.py``: the pool process, and the workers of one dataset in it, shared
  by every rank that loads the same dataset (scheduling, loading a tensor-parallel group's
  batch once, deaths);
- ``workers.py``: ``NodeWorkers``, a rank's side, behind the ``Workers`` interface.
"""

from .workers import NodeWorkers

__all__ = ["NodeWorkers"]
