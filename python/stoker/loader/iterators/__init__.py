"""The iterators (``multi``: workers; ``single``: ``num_workers=0``) and the parts the multi-process
one composes: the task table, recovery, the hang watch, statistics, worker start-up, re-raised
worker failures, the exit hook; ``serve`` is the one way in, for ``stoker.DataLoader`` and
``enable()`` alike."""
