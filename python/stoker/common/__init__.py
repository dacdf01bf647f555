"""Any process: what every side of stoker uses, and nothing that runs only on one side.

The exceptions (``errors``), the one reader of ``/proc`` and the cgroup tree (``system``), the
one index normaliser (``indices``), every private name of torch (``torch_compat``), plain
checkpoint data (``plain``), the random generators' state (``rng_state``), a death named in words
(``deaths``), the loader's board others read (``board``), the gate threads load through (``gate``)
and the advice that tells waiting from computing (``advice``).
"""
