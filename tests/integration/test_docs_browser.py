"""The docs check: the site built with --strict, served on loopback and opened in
headless Chromium at 1280 px (docsite/browser.py), as a reader sees it: the home page
sells with the measured figures and draws the turn, the comparison page compares, the
configuration reference prints its types as written and never breaks a name, the
diagrams are drawn as SVG (from the vendored mermaid, offline), no code block is cut.
Screenshots of the key pages go to $KASPER_DOCS_SHOTS (default: the test's folder).
Needs Chromium: `make chromium` installs it, `make test` and `make docs-check` run it."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from docsite import browser
from docsite.blocks import ROOT

pytestmark = pytest.mark.browser

PAGES = ("", "comparison", "reference/config", "reference/cli", "guarantees",
         "applications", "streams-dsl", "architecture", "operations", "performance")
"""The pages opened: the home, the comparison, the references, the pages with diagrams,
the two whose code has the longest lines and the two with the widest tables."""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The site built strictly (through `python -m docsite`), the probe added to the
    pages above, served: its base URL."""
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "docsite", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=180, check=False)
    assert result.returncode == 0, result.stderr
    assert "end of life" not in result.stdout + result.stderr
    for page in PAGES:
        browser.add_probe(out, page)
    with browser.serve(out) as base:
        yield base


@pytest.fixture(scope="module")
def shown(site: str) -> dict[str, dict[str, Any]]:
    """What each page shows once its scripts have run, by page."""
    return {page: browser.report(_url(site, page)) for page in PAGES}


def _url(base: str, page: str) -> str:
    return f"{base}{page}/" if page else base


def test_home_sells_and_explains(shown: dict[str, dict[str, Any]]) -> None:
    home = shown[""]
    assert home["title"] == "kasper_py - kasper_py"
    assert home["h1"].rstrip("¶") == "kasper_py"
    for text in ("Why kasper_py", "5.61\u00d7", "708,893 msgs/s", "0.92\u00d7", "make demo",
                 "make test", "class Upper(MessageProcessor):", "Compared"):
        assert text in home["text"], text
    assert home["diagrams"] == 1
    assert "1 · process" in home["drawn"][0]
    assert "5 · commit" in home["drawn"][0]


def test_comparison_compares_point_by_point(shown: dict[str, dict[str, Any]]) -> None:
    page = shown["comparison"]
    assert page["title"] == "Compared - kasper_py"
    for text in ("Faust", "Quix Streams", "Kafka Streams", "Processing model", "State",
                 "Delivery guarantees", "Joins and co-partitioning", "Reprocessing",
                 "Standby and restore", "DSL", "Testing", "Language",
                 "Where the others are ahead"):
        assert text in page["text"], text
    assert page["page_overflow"] <= 0


def test_config_reference_prints_types_and_names_whole(
        shown: dict[str, dict[str, Any]]) -> None:
    page = shown["reference/config"]
    assert page["title"] == "Configuration fields - kasper_py"
    assert "&#124;" not in page["text"]
    assert "Sequence[int] | None" in page["text"]
    assert "KASPER_BOOTSTRAP_SERVERS" in page["text"]
    assert page["broken_names"] == []
    assert page["page_overflow"] <= 0
    assert "&#124;" not in shown["reference/cli"]["text"]
    for page in PAGES:
        assert shown[page]["broken_names"] == [], page


def test_diagrams_are_drawn(shown: dict[str, dict[str, Any]]) -> None:
    """Every diagram is an SVG with its labels; none is mermaid's syntax error."""
    assert shown["guarantees"]["diagrams"] == 1
    assert "5 · commit batch n's offsets" in shown["guarantees"]["drawn"][0]
    assert shown["applications"]["diagrams"] == 1
    assert "turn n+1" in shown["applications"]["drawn"][0]
    for page in PAGES:
        assert len(shown[page]["drawn"]) == shown[page]["diagrams"], page
        for drawn in shown[page]["drawn"]:
            assert "Syntax error" not in drawn, page


def test_nothing_is_cut(shown: dict[str, dict[str, Any]]) -> None:
    """A code line longer than the column wraps, and every table fits the page: no
    block or table is wider than it shows."""
    assert shown["streams-dsl"]["code_blocks"] > 0
    assert shown["architecture"]["code_blocks"] > 0
    for page in PAGES:
        assert shown[page]["cut_code"] == [], page
        assert shown[page]["cut_tables"] == [], page
        assert shown[page]["page_overflow"] <= 0, page


def test_screenshots(site: str, tmp_path: Path) -> None:
    """A screenshot of each key page, 1280 px wide, for a reader to look at."""
    shots = Path(os.environ.get("KASPER_DOCS_SHOTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    for page in ("", "comparison", "reference/config", "applications"):
        png = shots / f"{page.replace('/', '-') or 'home'}.png"
        browser.screenshot(_url(site, page), png)
        header = png.read_bytes()[:24]
        assert header[:8] == b"\x89PNG\r\n\x1a\n"
        assert struct.unpack(">II", header[16:24]) == (browser.WIDTH, 2000)
