"""The code blocks of the documentation pages, with what the page says about each: its
language, and the HTML comments right above its fence (hidden on the site):

- ``<!-- compile-only: REASON -->``: a Python block that would block or needs what a
  unit test does not have (a live topic, Spark, a reader's module); it is compiled, and
  only its imports from kasper_py and the standard library, classes and functions run.
- ``<!-- setup: CODE -->``: Python run before the block, for the names a snippet takes
  from the surrounding text (its imports, a ``config``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
"""The pages whose blocks are run: the README (the site's overview) and docs/."""

_FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>\S*)\s*$")
_MARKER = re.compile(r"<!--\s*(compile-only|setup):(.*?)-->", re.DOTALL)


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    compile_only: str | None = None  # the reason, when the page marks it so
    setup: str = ""

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page``, in order, with the markers right above it."""
    lines = page.read_text().split("\n")
    found: list[Block] = []
    index = 0
    while index < len(lines):
        fence = _FENCE.match(lines[index])
        if not fence:
            index += 1
            continue
        indent, end = len(fence["indent"]), index + 1
        while not lines[end].strip().startswith("```"):
            end += 1
        code = "\n".join(line[indent:] for line in lines[index + 1:end])
        markers = {kind: text.strip()
                   for kind, text in _MARKER.findall(_comments_above(lines, index))}
        found.append(Block(page, index + 1, fence["lang"], code + "\n",
                           markers.get("compile-only"), markers.get("setup", "")))
        index = end + 1
    return found


def _comments_above(lines: list[str], index: int) -> str:
    """The HTML comments that end on the lines right above line ``index``, one after
    another with no blank line between."""
    above, comments = "\n".join(lines[:index]), []
    while above.rstrip(" ").endswith("-->"):
        start = above.rfind("<!--")
        if start < 0:
            break
        comments.append(above[start:])
        above = above[:start].rstrip(" ").removesuffix("\n")
    return "\n".join(comments)
