"""What a loader is configured with and remembers: ``options`` (stoker's options, each declared
once), ``seeding`` (per-worker and per-sample seeds), ``records`` (the loader's one side-car:
epochs, skips, deaths, quarantine, autotune's memory, the resume point), ``load`` (how a worker
loads: one frozen ``LoadSettings``, carried whole to every worker), ``placement`` (``Node``,
``Ray``). Made in the training process; ``load`` and ``seeding`` travel to workers. Imports only
the leaves."""
