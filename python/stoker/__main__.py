"""The ``stoker`` command: ``stoker run``, ``stoker bench``, ``stoker top``, ``stoker doctor``."""

from __future__ import annotations

import sys

# command -> (module whose main(argv) runs it, what it does in a line)
COMMANDS = {
    "run": ("stoker.tools.run",
            "run a training script unchanged, every torch DataLoader on stoker's engine"),
    "bench": ("stoker.tools.bench.cli",
              "measure stoker against torch's DataLoader (and peers) on this machine"),
    "top": ("stoker.tools.top", "a live view of every stoker loader on this machine and its workers"),
    "doctor": ("stoker.tools.doctor",
               "check this machine and a running loader: what it is short of, what to change"),
}


def usage() -> str:
    lines = ["usage: stoker COMMAND [options]", "", "commands:"]
    width = max(map(len, COMMANDS))
    lines += [f"  {name:<{width}}  {what}" for name, (_, what) in COMMANDS.items()]
    lines += ["", "stoker COMMAND --help says more of each."]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if argv and argv[0] == "--version":
        from . import __version__

        print(f"stoker {__version__}")
        return 0
    if not argv or argv[0] not in COMMANDS:
        if argv:
            print(f"stoker: no command {argv[0]!r}", file=sys.stderr)
        print(usage(), file=sys.stderr)
        return 2
    import importlib

    return importlib.import_module(COMMANDS[argv[0]][0]).main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
