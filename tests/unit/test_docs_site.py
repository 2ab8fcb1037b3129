"""The documentation site (mkdocs.yml) builds with --strict: a broken link or anchor, a
missing page or a page left out of the navigation fails. Its reference pages are
generated from the code at build time (docsite/reference.py)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

from docsite import reference
from docsite.blocks import ROOT
from kasper_py.config import Config, OutputTopic


def test_site_builds_strict(tmp_path: Path) -> None:
    """`python -m docsite build --strict` (mkdocs) succeeds, with the generated pages in
    the site, and without Material's end-of-life banner."""
    env = {k: v for k, v in os.environ.items() if k != "NO_MKDOCS_2_WARNING"}
    result = subprocess.run(
        [sys.executable, "-m", "docsite", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False, env=env)
    assert result.returncode == 0, result.stderr
    assert "end of life" not in result.stdout + result.stderr
    for page in ("reference/config", "reference/cli", "overview", "examples", "grafana"):
        assert (tmp_path / page / "index.html").is_file(), page


def test_generated_pages_are_not_committed() -> None:
    """The reference pages exist only in the built site, never as files to edit."""
    assert not (ROOT / "docs" / "reference").exists()


def test_config_page_has_every_field() -> None:
    """Every Config and OutputTopic field is on the page with its docstring."""
    page = reference.config_page()
    for cls in (Config, OutputTopic):
        docs = reference.field_docs(cls)
        for field in dataclasses.fields(cls):
            assert f"`{field.name}`" in page
            assert docs[field.name].split()[0].replace("``", "`") in page


def test_configuration_summary_names_every_field() -> None:
    """configuration.md's short table of fields (a guide, with links) names every
    Config field, so a new field cannot be left out of it."""
    text = (ROOT / "docs" / "configuration.md").read_text()
    named = {name for row in re.findall(r"^\| (`[^|]*) \|", text, re.M)
             for name in re.findall(r"`(\w+)`", row)}
    assert {f.name for f in dataclasses.fields(Config)} <= named


def _commands(prefix: str, parser: argparse.ArgumentParser) -> list[str]:
    found = [prefix]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _commands(f"{prefix} {name}", sub)
    return found


def test_cli_page_has_every_command() -> None:
    """Each command of `kasper` and of the commands with parsers of their own has a
    section; the stubs `kasper` keeps for those are replaced by their own parsers."""
    page = reference.cli_page()
    own = {name for name, *_ in reference.PARSERS}
    for command, *_ in reference.PARSERS:
        for name in _commands(command, reference.build_parser(command)):
            if name in own - {command}:
                continue
            parser_has_leaf = f"## `{name}`" in page or any(
                line.startswith(f"## `{name} ") for line in page.splitlines())
            assert parser_has_leaf, name
