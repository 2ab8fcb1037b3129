"""mkdocs hooks (``mkdocs.yml``: ``hooks:``): add the generated reference pages and the
repository files the pages link to outside ``docs/`` (the README, the examples, the
dashboard's page), and point those links at their place in the site."""

from __future__ import annotations

import posixpath
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # mkdocs loads this file by path: make `docsite` importable

from docsite import reference  # noqa: E402

GENERATED = {"reference/config.md": reference.config_page,
             "reference/cli.md": reference.cli_page}
"""Pages built from the code at every build, never committed."""

INCLUDED = {"README.md": "overview.md", "examples/README.md": "examples/README.md",
            "grafana/README.md": "grafana/README.md"}
"""Repository files outside docs/ that become pages: repository path -> site path."""

_LINK = re.compile(r"(\]\()([^)\s#]+)((?:#[^)\s]*)?\))")


def site_path(repo_path: str) -> str | None:
    """Where repository file ``repo_path`` is in the site, if it is."""
    if repo_path.startswith("docs/"):
        return repo_path.removeprefix("docs/")
    if repo_path in INCLUDED:
        return INCLUDED[repo_path]
    if repo_path.startswith("examples/") and repo_path.endswith(".py"):
        return repo_path  # copied as they are, for the pages that link to them
    return None


def _repo_path(src_uri: str) -> str:
    return next((repo for repo, site in INCLUDED.items() if site == src_uri), f"docs/{src_uri}")


def relink(markdown: str, src_uri: str) -> str:
    """``markdown`` of the page at ``src_uri`` with its relative links to repository
    files re-pointed at their place in the site; other links are left for mkdocs to
    check."""
    page_repo_dir = posixpath.dirname(_repo_path(src_uri))

    def replace(match: re.Match[str]) -> str:
        target = match.group(2)
        if "://" in target or target.startswith(("/", "mailto:")):
            return match.group(0)
        site = site_path(posixpath.normpath(posixpath.join(page_repo_dir, target)))
        if site is None:
            return match.group(0)
        new = posixpath.relpath(site, posixpath.dirname(src_uri) or ".")
        return f"{match.group(1)}{new}{match.group(3)}"

    return _LINK.sub(replace, markdown)


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for uri, page in GENERATED.items():
        files.append(File.generated(config, uri, content=page()))
    for repo_path, uri in INCLUDED.items():
        files.append(File.generated(config, uri, abs_src_path=str(ROOT / repo_path)))
    for example in sorted((ROOT / "examples").glob("*.py")):
        uri = f"examples/{example.name}"
        files.append(File.generated(config, uri, abs_src_path=str(example)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return relink(markdown, page.file.src_uri)
