"""The code blocks of the docs (README.md, docs/guide/*.md), as a reader pastes them.

``blocks(path)`` reads a page's fenced blocks: each has its info string (``python``, ``bash``,
``text``, ...), its code, the line its fence opens on, and, for a block that must not run, the
reason given on the line right before its fence::

    <!-- doc-test: skip: needs a Ray cluster -->
    ```python
    ...

``script(page_blocks)`` is what a page's runnable python blocks make together: one script, the
blocks in order (a block may use what an earlier one defined, as a reader pasting them one after
the other would), each marked with the line it comes from, so that a traceback names the doc's
line (``doc_line``).
"""

from __future__ import annotations

import dataclasses
import re

SKIP = re.compile(r"^<!--\s*doc-test:\s*skip:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")
MARK = "# doc-test: block at line "


@dataclasses.dataclass(frozen=True)
class Block:
    lang: str
    code: str
    line: int  # the line its opening fence is on (1-based)
    skip: str | None  # why it does not run (None: it runs, when it is python)

    @property
    def runs(self) -> bool:
        return self.lang == "python" and self.skip is None


def blocks(path: str) -> list[Block]:
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.group(1), m.group(2), m.group(3).lower()
        prev = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        skip = SKIP.match(prev.strip())
        if prev.strip().startswith("<!--") and "doc-test" in prev and not skip:
            raise ValueError(f"{path}:{i}: a doc-test marker not of the form "
                             "'<!-- doc-test: skip: <reason> -->'")
        if skip and not skip.group(1):
            raise ValueError(f"{path}:{i}: a doc-test skip marker says no reason")
        body = []
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j])
            j += 1
        if j == len(lines):
            raise ValueError(f"{path}:{i + 1}: a code block that never closes")
        out.append(Block(lang, "\n".join(body) + "\n", i + 1, skip.group(1) if skip else None))
        i = j + 1
    return out


def script(page_blocks: list[Block]) -> str:
    """The page's runnable python blocks as one script, each after a line naming its place."""
    return "".join(f"{MARK}{b.line}\n{b.code}" for b in page_blocks if b.runs)


def doc_line(script_text: str, script_line: int) -> int | None:
    """The doc's line of line `script_line` (1-based) of ``script``'s text."""
    lines = script_text.splitlines()
    for k in range(min(script_line, len(lines)) - 1, -1, -1):
        if lines[k].startswith(MARK):
            return int(lines[k][len(MARK):]) + (script_line - 1 - k)
    return None
