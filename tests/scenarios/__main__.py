"""``python -m scenarios MODULE.FUNCTION [JSON-ARGS]``: runs one scenario (see ``__init__``).

`JSON-ARGS` is a JSON list of positional arguments, or an object ``{"args": [...], "kwargs":
{...}}``.

Prints "OK" as the last line of stdout once the scenario's function has returned, and only
then: an assertion that fails, an error the scenario did not expect, an error it expected that
never came (``scenarios.expect_raises``) all end the process with a traceback and exit code 1
before it. Scenarios print no "OK" of their own (``support.scenarios.expect_ok`` reads this
one)."""

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
    # after what the scenario printed (sys.stdout may be a pipe, block-buffered)
    sys.stdout.flush()
    print("OK", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
