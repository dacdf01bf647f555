"""What crosses a worker's channel, on the sender's side and the reader's: what travels
(``protocol``), how a spawned worker's start is sealed into one memfd (``sealed``) and
descriptors are passed (``fdpass``), a stream's state (``stream_state``), and what a worker's
messages become where they are read (``events``, ``buffer_batch``, and the ``board`` that
``stoker top`` reads). Workers import it to send; the training process, the node pool and
``stoker top`` to read."""
