"""The docs run: every python block of README.md and docs/guide/*.md, as a reader pastes it
(tests/support/doc_blocks.py reads them). A page's blocks run in order as one script in a fresh
interpreter, in an empty folder, with nothing but stoker and what it needs installed; a block
that cannot run here (a cluster, a GPU, a multi-GB download) says why on the line before its
fence (``<!-- doc-test: skip: <reason> -->``). An example that breaks fails the suite, naming
the doc's line."""

from __future__ import annotations

import glob
import os
import re
import signal
import subprocess
import sys

import pytest

from support.doc_blocks import blocks, doc_line, script
from support.scenarios import HERE  # tests/

ROOT = os.path.dirname(HERE)
PAGES = [os.path.join(ROOT, "README.md"),
         *sorted(glob.glob(os.path.join(ROOT, "docs", "guide", "*.md")))]
PAGE_TIMEOUT_S = 300  # a bound on a hang, not a speed: a page takes seconds


def _rel(path: str) -> str:
    return os.path.relpath(path, ROOT)


def _runs(path: str) -> bool:
    return any(b.runs for b in blocks(path))


@pytest.mark.unit
@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_block_of_a_page_parses_and_each_skip_says_why(page):
    for b in blocks(page):
        assert b.skip is None or len(b.skip) > 3, f"{_rel(page)}:{b.line}: say why it is skipped"


@pytest.mark.unit
def test_the_reader_of_blocks_and_the_line_it_names(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "# A page\n"                                  # 1
        "\n"                                          # 2
        "```python\n"                                 # 3
        "x = 1\n"                                     # 4
        "```\n"                                       # 5
        "```bash\n"                                   # 6
        "make test\n"                                 # 7
        "```\n"                                       # 8
        "<!-- doc-test: skip: needs a GPU -->\n"      # 9
        "```python\n"                                 # 10
        "import cuda_only\n"                          # 11
        "```\n"                                       # 12
        "```python\n"                                 # 13
        "y = x + 1\n"                                 # 14
        "raise ValueError(y)\n"                       # 15
        "```\n")                                      # 16
    found = blocks(str(page))
    assert [(b.lang, b.line, b.skip, b.runs) for b in found] == [
        ("python", 3, None, True), ("bash", 6, None, False),
        ("python", 10, "needs a GPU", False), ("python", 13, None, True)]
    text = script(found)
    assert "cuda_only" not in text and "make test" not in text
    # the script's line 5 is "raise ValueError(y)": the doc's line 15
    assert text.splitlines()[4] == "raise ValueError(y)" and doc_line(text, 5) == 15
    assert doc_line(text, 2) == 4


@pytest.mark.unit
def test_a_marker_that_is_not_a_skip_with_a_reason_is_refused(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- doc-test: skip: -->\n```python\nx = 1\n```\n")
    with pytest.raises(ValueError, match="no reason"):
        blocks(str(page))
    page.write_text("<!-- doc-test: off -->\n```python\nx = 1\n```\n")
    with pytest.raises(ValueError, match="not of the form"):
        blocks(str(page))


def _where(text: str, stderr: str) -> str:
    lines = [int(n) for n in re.findall(r'File ".*page\.py", line (\d+)', stderr)]
    at = doc_line(text, lines[-1]) if lines else None
    return f"line {at}" if at is not None else "a line the traceback does not name"


@pytest.mark.parametrize("page", [p for p in PAGES if _runs(p)], ids=_rel)
def test_the_pages_python_runs_as_pasted(page, tmp_path):
    text = script(blocks(page))
    path = tmp_path / "page.py"
    path.write_text(text)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # stoker as installed
    env["STOKER_NODE_LINGER_S"] = "0"  # (a node pool a page starts ends with it, not 5 s after)
    proc = subprocess.Popen([sys.executable, str(path)], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=PAGE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{_rel(page)}: its examples did not end in {PAGE_TIMEOUT_S} s (at "
                    f"{_where(text, err)}?)\n{err[-3000:]}")
    assert proc.returncode == 0, (
        f"{_rel(page)}: the example at {_where(text, err)} failed (exit {proc.returncode}):\n"
        f"{err[-4000:]}\n{out[-1000:]}")


GUIDE = ("failures", "resume", "network", "spawn", "node", "ray", "gpu", "observability")


@pytest.mark.unit
def test_the_readme_is_a_front_door():
    """Read in five minutes: at most 250 lines, install and a quick start before line 60, and a
    guide page for each feature (docs/guide/)."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move detail to docs/guide/"
    heads = {line.strip("# ").lower(): n for n, line in enumerate(lines, 1)
             if line.startswith("## ")}
    assert heads.get("install", 999) < 60 and heads.get("quick start", 999) < 60, heads
    for name in GUIDE:
        assert os.path.isfile(os.path.join(ROOT, "docs", "guide", name + ".md")), name


@pytest.mark.unit
@pytest.mark.parametrize("page", [*PAGES, os.path.join(ROOT, "docs", "develop.md")], ids=_rel)
def test_every_relative_link_leads_to_a_file(page):
    with open(page, encoding="utf-8") as f:
        text = f.read()
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        path = target.split("#", 1)[0]
        if not path or re.match(r"^[a-z]+:", path):
            continue  # an anchor of the page itself, or a URL
        if not os.path.exists(os.path.join(os.path.dirname(page), path)):
            broken.append(target)
    assert not broken, f"{_rel(page)}: links to nothing: {broken}"
