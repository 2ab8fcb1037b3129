"""Every code block of the documentation (README.md and docs/*.md) is run, by language:

- ``python``: run in one namespace per page, in page order (a block may use what an
  earlier one defined), in a temporary directory. A block marked
  ``<!-- compile-only: REASON -->`` is compiled, and only its imports from kasper_py and
  the standard library, classes and functions run. The marked ones, each because it
  would block forever or needs what a unit test does not have: the minimal processor
  (README, getting-started: ``run_until_stopped()`` on a live topic), the metrics and
  restore-log observers (operations: ``run_loop()`` on a live topic), ``stores.md``'s
  word count (``run_loop()``), ``time-and-windows.md``'s tasks (a ``TopicProcessor``
  with real Kafka clients), the query client (a running query server), ``reprocess()``
  and ``stream()`` (Spark, and the reader's own ``myapp``).
- ``toml``: loaded by the CLI's config loader (``load_config``); a block without
  ``name`` is a part of a config, loaded on top of a minimal one.
- ``sh``/``bash`` (every line a command) and ``console`` (lines after ``$ ``): a
  ``kasper`` command's arguments are parsed by its parser, also when spark-submit or
  ``python -m kasper_py.X`` runs it; ``make`` targets exist in the Makefile; an example
  script run with flags accepts them (its ``--help`` lists them). Usage notation is
  read as written: ``[--flag]`` is given, ``a|b`` takes ``a``.
- ``json``: parsed.
- ``sql``: the Cassandra table stores.md shows must be the one the store creates (the
  statement in kasper_py/stores/cassandra.py, read with ``ast``), placeholders aside.
- ``text`` (diagrams in characters, program output) and ``mermaid`` (diagrams the site
  draws) are not code. A block without a language fails.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from docsite.blocks import PAGES, ROOT, Block, blocks
from docsite.reference import build_parser, parser_for

NOT_RUN = {"text", "mermaid"}
UNCHECKED_PROGRAMS = {"pip", "export", "printf", "kill", "wait"}
"""Shell programs whose lines are not checked: packaging, the environment, the shell's
own (text piped into a command, stopping a background job)."""
_SEPARATORS = re.compile(r"\s+\|\|?\s+|\s*;\s*|\s+&&\s+|\s+&(?:\s+|$)")
SPARK_ENTRIES = {"kasper_py/stream/__main__.py": "stream", "$ENTRY": "reprocess"}
"""The entry scripts the pages hand spark-submit, and the kasper command each runs."""
PYTHON_MODULES = {"kasper_py.reprocess": "reprocess", "kasper_py.stream": "stream",
                  "kasper_py.stack": "stack", "kasper_py.query": "query"}


def _page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


# -- python -------------------------------------------------------------------------------

def _definitions_only(tree: ast.Module) -> ast.Module:
    """``tree`` with only its classes, functions and imports of kasper_py and the
    standard library: what a compile-only block lends the blocks after it."""
    def runs(node: ast.stmt) -> bool:
        if isinstance(node, ast.ClassDef | ast.FunctionDef):
            return True
        modules = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                   [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        return bool(modules) and all(m.split(".")[0] in sys.stdlib_module_names
                                     or m.split(".")[0] == "kasper_py" for m in modules)
    return ast.Module(body=[n for n in tree.body if runs(n)], type_ignores=[])


def _run_python(block: Block, namespace: dict[str, Any]) -> None:
    if block.setup:
        exec(compile(block.setup, f"{block.where} (setup)", "exec"), namespace)
    tree = ast.parse(block.code, block.where)
    if block.compile_only is not None:
        compile(tree, block.where, "exec")
        tree = _definitions_only(tree)
    exec(compile(tree, block.where, "exec"), namespace)


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_python_blocks_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The page's Python blocks run in order in one namespace, as a reader would paste
    them; compile-only ones lend their definitions."""
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": f"docs_{page.stem}"}
    for block in blocks(page):
        if block.lang == "python":
            _run_python(block, namespace)


# -- toml ---------------------------------------------------------------------------------

_MINIMAL_CONFIG = 'name = "docs"\nbootstrap_servers = "127.0.0.1:9092"\ninput_topics = ["in"]\n'


def _load_toml(block: Block, tmp_path: Path) -> None:
    from kasper_py.cli.base import load_config

    whole = "name" in tomllib.loads(block.code)
    path = tmp_path / "kasper.toml"
    path.write_text(block.code if whole else _MINIMAL_CONFIG + block.code)
    load_config(str(path), env={})


# -- shell ----------------------------------------------------------------------------------

def _commands(block: Block) -> list[str]:
    """The block's command lines, continuation lines joined, prompts taken off."""
    lines = block.code.replace("\\\n", " ").splitlines()
    if block.lang == "console":
        return [line.strip()[2:] for line in lines if line.strip().startswith("$ ")]
    return [line.strip() for line in lines if line.strip()]


def _usage_as_written(words: list[str]) -> list[str]:
    """``[--flag value]`` as given, ``a|b|c`` as ``a``."""
    text = " ".join(words).replace("[", "").replace("]", "")
    return [word.split("|")[0] for word in text.split()]


def _parse_kasper(argv: list[str], where: str) -> None:
    argv = _usage_as_written(argv)
    if argv[1:] == ["..."]:  # "the same arguments": the parser must at least build
        build_parser(f"kasper {argv[0]}")
        return
    parser, rest = parser_for(argv)
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            parser.parse_args(rest)
    except SystemExit as exc:
        pytest.fail(f"{where}: `kasper {' '.join(argv)}` does not parse (exit {exc.code}): "
                    f"{stderr.getvalue().strip()}")


def _check_example(words: list[str], where: str) -> None:
    script = ROOT / words[0]
    assert script.is_file(), f"{where}: {words[0]} does not exist"
    shown = subprocess.run([sys.executable, str(script), "--help"], capture_output=True,
                           text=True, timeout=60, check=True).stdout
    for flag in (w for w in words[1:] if w.startswith("--")):
        assert flag in shown, f"{where}: {words[0]} has no {flag}"


def _shell_commands(line: str) -> list[list[str]]:
    """The commands of one shell line: split at `` | ``, ``;``, `` && ``, `` || `` and
    `` &`` (spaced, so usage notation's ``a|b`` stays one word)."""
    pieces = _SEPARATORS.split(line.split(" #", maxsplit=1)[0])
    return [words for piece in pieces if (words := shlex.split(piece, comments=True))]


def _check_command(line: str, block: Block) -> None:
    if "$(" in line:  # a variable set from a command's output: the shell's business
        return
    for words in _shell_commands(line):
        skip = 0
        while skip < len(words) and re.match(r"^[A-Z_]+=", words[skip]):  # VAR=value first
            skip += 1
        _check_words(words[skip:], block)


def _check_words(words: list[str], block: Block) -> None:
    if not words or words[0] in UNCHECKED_PROGRAMS:
        return
    program = words[0]
    if program == "kasper":
        _parse_kasper(words[1:], block.where)
    elif program == "make":
        makefile = (ROOT / "Makefile").read_text()
        for target in words[1:]:
            assert re.search(rf"^{re.escape(target)}:", makefile, re.M), \
                f"{block.where}: no `make {target}`"
    elif program.endswith("python") and words[1:2] == ["-m"]:
        assert words[2] in PYTHON_MODULES, f"{block.where}: unknown module {words[2]}"
        _parse_kasper([PYTHON_MODULES[words[2]], *words[3:]], block.where)
    elif program.endswith("python") and words[1].startswith("examples/"):
        _check_example(words[1:], block.where)
    elif program == "spark-submit":
        entry = next(i for i, w in enumerate(words) if w in SPARK_ENTRIES)
        _parse_kasper([SPARK_ENTRIES[words[entry]], *words[entry + 1:]], block.where)
    else:
        pytest.fail(f"{block.where}: no check for `{program}`: add one, or list it in "
                    "UNCHECKED_PROGRAMS with the reason")


# -- sql ----------------------------------------------------------------------------------

def _cassandra_create_table() -> str:
    """The CREATE TABLE statement the Cassandra store runs, ``{}`` for its table name."""
    tree = ast.parse((ROOT / "kasper_py" / "stores" / "cassandra.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(part.value if isinstance(part, ast.Constant) else "{}"
                           for part in node.values)
            if text.startswith("CREATE TABLE"):
                return text
    raise AssertionError("no CREATE TABLE in kasper_py/stores/cassandra.py")


def _columns(statement: str) -> str:
    """The statement from its column list on, comments dropped and spaces collapsed."""
    text = re.sub(r"--[^\n]*", "", statement)
    return " ".join(text[text.index("("):].split()).replace("( ", "(").replace(" )", ")")


def _check_sql(block: Block) -> None:
    assert _columns(block.code) == _columns(_cassandra_create_table()), \
        f"{block.where}: not the table kasper_py/stores/cassandra.py creates"


# -- every block ------------------------------------------------------------------------------

@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_other_blocks_check(page: Path, tmp_path: Path) -> None:
    """The page's TOML loads into a Config, its commands parse, its JSON parses, and
    every block says its language."""
    for block in blocks(page):
        if block.lang == "toml":
            _load_toml(block, tmp_path)
        elif block.lang in ("sh", "bash", "console"):
            for line in _commands(block):
                _check_command(line, block)
        elif block.lang == "json":
            json.loads(block.code)
        elif block.lang == "sql":
            _check_sql(block)
        else:
            assert block.lang in NOT_RUN | {"python"}, \
                f"{block.where}: a block needs a language (python, toml, sh, console, " \
                f"json, or text for a diagram or output); got {block.lang!r}"
