"""``stoker run``: run a training script, unchanged, with every DataLoader on stoker's engine.

    stoker run train.py --lr 0.1                     # like `python train.py --lr 0.1`
    stoker run --on-error skip -m mypkg.train ...    # like `python -m mypkg.train ...`
    torchrun --nproc-per-node 2 -m stoker run train.py   # each rank
    STOKER_ON_ERROR=skip stoker run train.py         # options from the environment

It calls ``stoker.enable()`` with the options given as flags (or as ``STOKER_<OPTION>``
environment variables; a flag wins), then runs the script as ``__main__`` the way
``python -m cProfile`` does. Processes the script starts see the same setting: spawned workers
and ranks (Lightning's DDP re-runs the script) through ``STOKER_ENABLE`` in the environment and
stoker's ``sitecustomize`` on ``PYTHONPATH``. One log line per loader says stoker serves it
(``--quiet`` silences stoker's info lines). Every flag and variable comes from the option's one
declaration (``config.options.Options``).

Runs on the main thread of the process ``stoker run`` starts.
"""

from __future__ import annotations

import json
import logging
import os
import runpy
import sys

from ..config.options import Options
from ..loader.integrations import children
from ..loader.integrations import enable as _enable

USAGE = ("usage: stoker run [--OPTION VALUE ...] [--quiet] (script.py | -m module) [args ...]\n"
         "options: " + " ".join(Options.flag(n) for n in Options.names()))


def parse(argv: list[str]) -> tuple[dict, bool, str | None, str | None, list[str]]:
    """(options, quiet, script, module, the script's arguments); raises ValueError."""
    options = Options.from_environment(os.environ)
    quiet = False
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--quiet":
            quiet = True
            i += 1
            continue
        if arg == "-m":
            if i + 1 >= len(argv):
                raise ValueError("-m needs a module name")
            return options, quiet, None, argv[i + 1], argv[i + 2:]
        if arg.startswith("--"):
            key, eq, value = arg[2:].partition("=")
            name = key.replace("-", "_")
            if name not in Options.names():
                raise ValueError(f"unknown option {arg}")
            if not eq:
                if i + 1 >= len(argv):
                    raise ValueError(f"{arg} needs a value")
                value = argv[i + 1]
                i += 1
            options[name] = Options.parse(name, value)
            i += 1
            continue
        return options, quiet, arg, None, argv[i + 1:]
    raise ValueError("nothing to run: give a script or -m module")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__ + "\n" + USAGE)
        return 0
    try:
        options, quiet, script, module, args = parse(argv)
        resolved = Options.from_mapping(options)
    except (ValueError, TypeError) as e:
        print(f"stoker run: {e}\n{USAGE}", file=sys.stderr)
        return 2
    if not quiet:
        log = logging.getLogger("stoker")
        if not log.handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(message)s"))
            log.addHandler(handler)
            log.setLevel(logging.INFO)
    # Children: the options in the environment, and our sitecustomize that reads them.
    children.reach_reruns(os.environ, json.dumps(resolved.to_json()))
    _enable.enable(**options)
    if module is not None:
        sys.argv = [module] + args
        sys.path.insert(0, os.getcwd())
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        if not os.path.exists(script):
            print(f"stoker run: no such script: {script}", file=sys.stderr)
            return 2
        sys.argv = [script] + args
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
        runpy.run_path(script, run_name="__main__")
    return 0
