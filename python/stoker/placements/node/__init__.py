"""One pool of workers per machine, serving every rank of a job (``placement=stoker.Node()``).

Its parts, one job per module (docs/design/node.md has the whole picture, the threads and the
threat model):

- ``wire.py``: the connection between a rank and the pool (an abstract Unix socket named for
  the user and the job, peer credentials checked on both sides, descriptors passed beside the
  messages) and the table of messages both ends import;
- ``rendezvous.py``: which job a process belongs to, and a connection to its pool, started when
  there is none (with ``template.py``: a fork of the starting rank the pool's workers are forked
  from);
- the pool process: ``pool.py`` (its start and end), ``server.py`` (accepting, groups,
  lingering; the node's ``budget.py``), ``session.py`` (one connection), ``ranks.py`` (the rank
  processes watched), ``forker.py`` (its side of the template; ``link.py``: their messages),
  ``group.py`` (the workers of one dataset, shared by every rank that loads it: its records and
  scheduling),
  ``ledger.py`` and ``streams.py`` (batches held and kept for the ranks of a tensor-parallel
  group), ``deaths.py`` (the deaths only this placement has, named);
- a rank's side: ``workers.py`` (``NodeWorkers``, behind the ``Workers`` interface),
  ``hello.py`` (what it sends to join), ``connection.py`` (its socket and the batches it holds).
"""

from .workers import NodeWorkers

__all__ = ["NodeWorkers"]
