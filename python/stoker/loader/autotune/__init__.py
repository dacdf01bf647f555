"""``num_workers="auto"`` and ``prefetch_factor="auto"``: the pure ``tuner``, its ``measure``ments,
and the ``controller`` that applies decisions to an iterator through a small protocol.
docs/design/autotune.md explains it."""
