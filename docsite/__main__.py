"""``python -m docsite build|serve [mkdocs options]``: mkdocs, without the end-of-life
banner Material for MkDocs prints at every build.

The banner points at Zensical, Material's successor. Zensical 0.0.73 reads this
mkdocs.yml but runs no mkdocs hooks, so the site it builds has no generated reference
pages, none of the repository files docsite/hooks.py adds (the README, the examples,
the dashboard's page), and links to them broken: its strict build fails. Until it runs
hooks (or this site stops needing them), the site builds with mkdocs, and the banner,
which Material prints when its theme is imported (before any hook could run), is
turned off by the variable it reads, here, for every build the project runs.
"""

from __future__ import annotations

import os
import sys

from mkdocs.__main__ import cli

if __name__ == "__main__":
    os.environ.setdefault("NO_MKDOCS_2_WARNING", "1")
    sys.exit(cli(prog_name="python -m docsite"))
