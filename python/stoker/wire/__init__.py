"""Both ends of a worker's channel: what travels (``protocol``), how a spawned worker's start is
sealed into one memfd (``sealed``) and descriptors are passed (``fdpass``), a stream's state
(``stream_state``), and what a worker's messages become where its supervisor reads them
(``events``, ``buffer_batch``). The worker side imports it to send; the training process and the
node pool import it to receive."""
