"""What a person runs: the ``stoker`` command's ``run``, ``bench``, ``top`` and ``doctor``, and
the Prometheus collector (``monitoring``). Each runs in its own process or the training
process's; nothing below imports it."""
