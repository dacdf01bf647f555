"""Where workers run, behind one interface (``base.Workers``): local processes (``local``), the
node's one pool of workers for every rank (``node/``: its own processes), Ray actors (``ray/``),
or some of each (``mixed``); ``choose`` picks one from the ``placement``
option. Everything above (scheduling, supervision, resume, autotune) talks to workers only
through it; docs/design/placements.md says what a new placement must provide."""
