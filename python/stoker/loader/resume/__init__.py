"""Checkpoint and resume: the checkpoint document (``state``), where an epoch is (``position``),
the iterator's cursor that records it (``cursor``), what regenerates an epoch's order
(``order``), elastic resizing (``elastic``), and the loader's ``get_state``/``set_state``
(``checkpoint``). docs/design/resume.md explains it."""
