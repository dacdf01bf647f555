"""stoker's options: one declaration (config/options.py) gives the defaults, the checks, the
`stoker run` flags, the STOKER_<OPTION> variables and the README's table. Pure: no processes."""

from __future__ import annotations

import dataclasses
import os
import re

import pytest

from stoker.config.options import Options, shared_memory_cap, shared_memory_share
from stoker.tools import run
from support.scenarios import HERE  # tests/

pytestmark = pytest.mark.unit  # no process (tests/support/tiers.py)

README = os.path.join(os.path.dirname(HERE), "README.md")


def test_defaults():
    o = Options()
    assert o.on_worker_death == "restart" and o.on_error == "raise" and o.max_retries == 3
    assert o.max_restarts is None and o.restart_budget(4) == 12
    assert Options(max_restarts=0).restart_budget(4) == 0
    assert o.max_shared_memory == "auto" and o.seed is None and not o.autotune
    assert o.describe() == "default options"
    assert Options(on_error="skip", max_retries=1).describe() == "on_error='skip', max_retries=1"


@pytest.mark.parametrize("name,bad", [
    ("on_worker_death", "retry"), ("max_restarts", -1), ("max_restarts", 1.5),
    ("on_error", "ignore"), ("max_retries", -1), ("max_retries", True),
    ("quarantine_after", 0), ("hang_timeout", 0), ("hang_timeout", "10"),
    ("stall_notice", 1.5), ("max_shared_memory", 0), ("max_shared_memory", "4GiB"),
    ("max_shared_memory", True), ("seed", "per_batch"), ("autotune", 1),
    ("autotune_prefetch", "yes"),
])
def test_a_bad_value_is_refused_naming_the_option(name, bad):
    with pytest.raises(ValueError, match=rf"^{name} .*got {re.escape(repr(bad))}"):
        Options(**{name: bad})


def test_unknown_options_are_named():
    with pytest.raises(TypeError, match="unknown stoker option.*'on_eror'"):
        Options.from_mapping({"on_eror": "skip"})
    assert Options.from_mapping({"on_error": "skip"}).on_error == "skip"


def test_options_are_frozen_and_replaced():
    o = Options()
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.on_error = "skip"
    assert o.replace(on_error="skip").on_error == "skip" and o.on_error == "raise"
    with pytest.raises(ValueError):
        o.replace(on_error="nope")


def test_flags_and_variables_come_from_the_names():
    assert Options.flag("on_worker_death") == "--on-worker-death"
    assert Options.env_var("on_worker_death") == "STOKER_ON_WORKER_DEATH"


@pytest.mark.parametrize("name,text,value", [
    ("on_error", "skip", "skip"), ("max_restarts", "5", 5), ("max_restarts", "none", None),
    ("hang_timeout", "2.5", 2.5), ("stall_notice", "None", None), ("autotune", "true", True),
    ("autotune_prefetch", "0", False), ("max_shared_memory", "auto", "auto"),
    ("max_shared_memory", "1048576", 1 << 20), ("seed", "per_sample", "per_sample"),
])
def test_text_is_read_per_option(name, text, value):
    assert Options.parse(name, text) == value


def test_text_that_cannot_be_read_is_named():
    with pytest.raises(ValueError, match="--max-retries: cannot read 'three'"):
        Options.parse("max_retries", "three")
    with pytest.raises(ValueError, match="unknown option --nope"):
        Options.parse("nope", "1")


def test_stoker_run_reads_flags_and_the_environment(monkeypatch):
    monkeypatch.setenv("STOKER_ON_ERROR", "skip")
    monkeypatch.setenv("STOKER_MAX_RETRIES", "7")
    options, quiet, script, module, args = run.parse(
        ["--max-retries", "2", "--hang-timeout=30", "--quiet", "train.py", "--lr", "0.1"])
    assert options == {"on_error": "skip", "max_retries": 2, "hang_timeout": 30.0}
    assert quiet and script == "train.py" and module is None and args == ["--lr", "0.1"]
    with pytest.raises(ValueError, match="unknown option --on-eror"):
        run.parse(["--on-eror", "skip", "train.py"])


def test_the_shared_memory_cap_and_each_workers_share():
    assert shared_memory_cap(None) is None and shared_memory_cap(1 << 20) == 1 << 20
    assert shared_memory_share(None, 4) is None
    assert shared_memory_share(8 << 20, 4) == 2 << 20
    assert shared_memory_share(8 << 20, 0) == 8 << 20


def _readme_table() -> dict[str, str]:
    """option -> default text, from the README's table of stoker's own options."""
    with open(README) as f:
        text = f.read()
    start = text.index("stoker's own options")
    rows = {}
    for line in text[start:].splitlines()[1:]:
        if rows and not line.startswith("|"):
            break
        m = re.match(r"\| `(\w+)` \| `?([^|`]+)`? \|", line)
        if m:
            rows[m.group(1)] = m.group(2).strip()
    return rows


def test_the_readme_table_is_the_declaration():
    table = _readme_table()
    assert list(table) == list(Options.names()), "README rows and Options fields differ"
    for name, shown in table.items():
        assert shown == Options.shown_default(name), (name, shown)


def test_the_dataloaders_keywords_are_the_declaration():
    """stoker.DataLoader spells its keywords out (frameworks read its signature to re-create
    loaders), so this checks them against the declaration: same names, same defaults."""
    import inspect

    import stoker

    params = inspect.signature(stoker.DataLoader.__init__).parameters
    ours = {n: p.default for n, p in params.items() if n in Options.names()}
    assert ours == Options().as_dict()
    loader = stoker.DataLoader(list(range(4)), on_error="skip", hang_timeout=5.0)
    assert Options.of(loader) == Options(on_error="skip", hang_timeout=5.0)


def test_placement_takes_every_form_and_travels_as_json():
    import json

    import stoker

    assert Options().placement is None and Options(placement="local").placement is None
    ray = Options(placement="ray", ray_address="10.0.0.1:6379").placement
    assert ray == stoker.Ray(address="10.0.0.1:6379")
    given = stoker.Ray(cpus_per_worker=2, local_workers=1)
    assert Options(placement=given).placement is given
    back = Options(**json.loads(json.dumps(Options(placement=given).to_json())))
    assert back.placement == given
    assert Options.parse("placement", "ray") == "ray"
    with pytest.raises(ValueError, match="placement must be None"):
        Options(placement="kubernetes")
    with pytest.raises(ValueError, match="cpus_per_worker"):
        stoker.Ray(cpus_per_worker=0)
    options, *_ = run.parse(["--placement", "ray", "--ray-address", "h:1", "train.py"])
    assert Options.from_mapping(options).placement == stoker.Ray(address="h:1")
