"""How stoker reaches loaders it did not build: ``enable()`` (every torch DataLoader in the
process), ``stoker run`` (a script, unchanged), and ``autoenable`` (children: spawn's preparation
data and ``stoker run``'s sitecustomize; loaded by file path). docs/design/enable.md explains it."""
