"""In a worker process: the worker's loop (``loop``), loading under the error policy
(``fetch``: a map and a stream fetcher, one retry rule), many samples in flight (``inflight``,
through one FIFO ``gate``), torch's collate (``collate``), the endpoint the loop reports through
(``endpoint``) and a local worker's start (``process``).

Nothing here runs in the training process but a ``num_workers=0`` iterator, which runs the same
fetchers in place."""
