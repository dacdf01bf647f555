"""Helpers the tests share that are not fixtures (``tests/`` is on ``sys.path`` under pytest:
``from support.scenarios import run_ok``)."""
