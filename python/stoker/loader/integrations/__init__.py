"""How stoker reaches loaders it did not build: ``enable()`` (every torch DataLoader in the
process), ``stoker run`` (a script, unchanged), and its children: ``children`` (what an enabled
process leaves for them: the environment, spawn's preparation data) and ``on_torch_import`` (the
child side, loaded by file path, which enables stoker there once torch is imported).
docs/design/enable.md explains it."""
