"""The mechanisms under every placement: the wire protocol between the main process and a worker
(``protocol``), the events a worker's messages become (``events``), the worker's loop and its
configuration (``worker``), fetching with torch's semantics and the error policy (``fetch``,
``collate``), a stateful stream's state (``stream_state``), a local worker process's set-up
(``process``), descriptor passing (``fdpass``), the loader's board (``board``), and naming deaths
(``deaths``). Imports the leaves and ``config``."""
