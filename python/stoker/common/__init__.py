"""Any process: what every side of stoker uses.

The exceptions (``errors``), the one reader of ``/proc`` and the cgroup tree (``system``), the
one index normaliser (``indices``), every private name of torch (``torch_compat``), plain
checkpoint data (``plain``), the random generators' state (``rng_state``), a death named in words
(``deaths``) and the advice that tells waiting from computing (``advice``).
"""
