"""The ``stoker`` command: ``stoker run``, ``stoker bench``, ``stoker top``, ``stoker doctor``."""

from __future__ import annotations

import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"run": "stoker.integrations.run", "bench": "stoker.bench.cli", "top": "stoker.top", "doctor": "stoker.doctor"}
    if not argv or argv[0] not in commands:
        print("usage: stoker {" + ",".join(commands) + "} [options]  (stoker COMMAND --help)",
              file=sys.stderr)
        return 2
    import importlib

    return importlib.import_module(commands[argv[0]]).main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
