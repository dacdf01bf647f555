"""What a loader is configured with and remembers: ``options`` (stoker's options, each declared
once), ``seeding`` (per-worker and per-sample seeds), ``records`` (the loader's one side-car:
epochs, skips, deaths, quarantine, autotune's memory, the resume point). Imports only the leaves."""
