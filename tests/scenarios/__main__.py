"""``python -m scenarios MODULE.FUNCTION [JSON-ARGS]``: runs one scenario (see ``__init__``).

`JSON-ARGS` is a JSON list of positional arguments, or an object ``{"args": [...], "kwargs":
{...}}``."""

from __future__ import annotations

import importlib
import json
import sys


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit("usage: python -m scenarios MODULE.FUNCTION [JSON-ARGS]")
    name = argv[0]
    module_name, _, function_name = name.rpartition(".")
    if not module_name:
        raise SystemExit(f"scenario {name!r}: expected MODULE.FUNCTION")
    args, kwargs = [], {}
    if len(argv) > 1:
        given = json.loads(argv[1])
        if isinstance(given, dict):
            args, kwargs = given.get("args", []), given.get("kwargs", {})
        else:
            args = given
    module = importlib.import_module(f"scenarios.{module_name}")
    getattr(module, function_name)(*args, **kwargs)


if __name__ == "__main__":
    main(sys.argv[1:])
