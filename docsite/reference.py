"""The reference pages generated at build time, so they never go stale: the
configuration fields from ``Config``'s field docstrings (read with ``ast``), and the
command line from the argparse parsers themselves."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import inspect
from collections.abc import Iterator
from typing import Any

# Where each command's parser is built: (command, module, builder, builder's arguments).
# The one place to change when the CLI code moves. A command listed here is documented
# from its own parser, and its stub in `kasper`'s parser is left out.
PARSERS: tuple[tuple[str, str, str, tuple[Any, ...]], ...] = (
    ("kasper", "kasper_py.cli.commands", "_parser", ()),
    ("kasper reprocess", "kasper_py.reprocess._cli", "_parser", ("kasper reprocess",)),
    ("kasper stream", "kasper_py.stream._cli", "_parser", ("kasper stream",)),
    ("kasper query", "kasper_py.cli.query", "_parser", ()),
    ("kasper standby", "kasper_py.cli.standby", "_parser", ()),
    ("kasper topics", "kasper_py.cli.topics", "_parser", ()),
    ("kasper produce", "kasper_py.cli.produce", "_parser", ()),
    ("kasper consume", "kasper_py.cli.consume", "_parser", ()),
    ("kasper stack", "kasper_py.stack._cli", "_parser", ()),
)


def build_parser(command: str) -> argparse.ArgumentParser:
    """The parser of ``command`` (a key of ``PARSERS``)."""
    for name, module, builder, args in PARSERS:
        if name == command:
            parser: argparse.ArgumentParser = getattr(importlib.import_module(module),
                                                      builder)(*args)
            return parser
    raise KeyError(command)


def parser_for(argv: list[str]) -> tuple[argparse.ArgumentParser, list[str]]:
    """The parser that reads ``kasper`` command line ``argv`` (without ``kasper``), and
    the arguments it reads: a command with a parser of its own takes what follows it."""
    if argv and f"kasper {argv[0]}" in {name for name, *_ in PARSERS}:
        return build_parser(f"kasper {argv[0]}"), argv[1:]
    return build_parser("kasper"), argv


# -- configuration ---------------------------------------------------------------------

def field_docs(cls: type) -> dict[str, str]:
    """Each field of dataclass ``cls`` and the docstring right under it, read from the
    source with ``ast``."""
    tree = ast.parse(inspect.getsource(inspect.getmodule(cls)))  # type: ignore[arg-type]
    node = next(n for n in ast.walk(tree)
                if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    docs: dict[str, str] = {}
    for statement, following in zip(node.body, node.body[1:], strict=False):
        if (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)):
            docs[statement.target.id] = inspect.cleandoc(following.value.value)
    return docs


def _markdown(text: str) -> str:
    """A reStructuredText docstring's ``code`` as Markdown, on one line per paragraph."""
    paragraphs = text.replace("``", "`").split("\n\n")
    return "<br><br>".join(" ".join(p.split()) for p in paragraphs)


def _cell(text: str) -> str:
    """``text`` fit for a table cell: a pipe outside a code span escaped as ``\\|``.
    A pipe inside a code span stays as it is, since the table extension does not split
    a row there, and an escape there (``&#124;`` or ``\\|``) would print as typed."""
    parts = text.split("`")
    return "`".join(part if index % 2 else part.replace("|", "\\|")
                    for index, part in enumerate(parts))


def _default(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        return f"`{f.default!r}`"
    if f.default_factory is not dataclasses.MISSING:
        return f"`{f.default_factory()!r}`"
    return "**required**"


def _field_rows(cls: type, sources: dict[str, tuple[str, str]]) -> Iterator[str]:
    """A row per field: its name, type, default and sources in the first cell (the
    name never broken), what it means in the second."""
    docs = field_docs(cls)
    hints = {n.target.id: ast.unparse(n.annotation)  # type: ignore[union-attr]
             for n in ast.walk(ast.parse(inspect.getsource(cls)))
             if isinstance(n, ast.AnnAssign)}
    for f in dataclasses.fields(cls):
        if f.name not in docs:
            raise ValueError(f"{cls.__name__}.{f.name} has no docstring under it")
        env, flag = sources.get(f.name, ("", ""))
        about = "<br>".join(x for x in (f"`{hints[f.name]}`", f"default {_default(f)}",
                                        env, flag) if x)
        yield (f"| <a id=\"{cls.__name__.lower()}-{f.name}\"></a>**`{f.name}`**<br>"
               f"{_cell(about)} | {_cell(_markdown(docs[f.name]))} |")


def config_page() -> str:
    """The configuration reference: every ``Config`` and ``OutputTopic`` field."""
    from kasper_py.cli.base import CONFIG_FLAGS, ENV_PREFIX, flag_name
    from kasper_py.config import Config, OutputTopic
    from kasper_py.registry import RegistryConfig

    sources = {
        f.name: (f"`{ENV_PREFIX}{f.name.upper()}`" if not f.name.endswith("_overrides")
                 else f"`{ENV_PREFIX}{f.name.removesuffix('_overrides').upper()}__<KEY>`",
                 f"`--{flag_name(f.name)}`" if f.name in CONFIG_FLAGS else "")
        for f in dataclasses.fields(Config)}
    header = ["| field: type, default, environment, flag | meaning |", "|---|---|"]
    return "\n".join([
        "---\nhide: [toc]\n---",  # the fields' table takes the page's width
        "",
        "# Configuration fields",
        "",
        "Generated when the site is built from the docstring under each field of "
        "`kasper_py.config.Config` and `OutputTopic`; the code is the source. A TOML file "
        "(`kasper run --config`) takes the field names as keys; an environment variable "
        "overrides the file and a flag overrides both. How they combine, and the Kafka "
        "clients' own settings: [Configuration](../configuration.md).",
        "",
        f"## Config\n\n{_markdown(inspect.getdoc(Config) or '')}",
        "",
        *header, *_field_rows(Config, sources),
        "",
        f"## OutputTopic\n\n{_markdown(inspect.getdoc(OutputTopic) or '')} In TOML, one "
        "`[[output_topics]]` table per topic; in the environment and flags, "
        "`NAME[:PARTITIONS]` separated by commas.",
        "",
        *header, *_field_rows(OutputTopic, {}),
        "",
        f"## RegistryConfig\n\n{_markdown(inspect.getdoc(RegistryConfig) or '')} In TOML, "
        "the `[registry]` table; in the environment and flags, the registry's URL alone.",
        "",
        *header, *_field_rows(RegistryConfig, {}),
        "",
    ])


# -- command line ------------------------------------------------------------------------

def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _invocation(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    metavar = "" if action.nargs == 0 else " " + (
        action.metavar if isinstance(action.metavar, str) else action.dest.upper())
    if action.nargs == "?":
        metavar = f" [{metavar.strip()}]"
    return ", ".join(f"`{option}{metavar}`" for option in action.option_strings)


def _help(action: argparse.Action) -> str:
    text = " ".join((action.help or "").split())
    if "%(" in text:
        text = text % {"default": action.default, "prog": "kasper"}
    if action.choices and not isinstance(action, argparse._SubParsersAction):
        choices = ", ".join(f"`{c}`" for c in action.choices)
        text = f"{text.rstrip('.')}. Choices: {choices}." if text else f"Choices: {choices}."
    return text


def _command_section(command: str, parser: argparse.ArgumentParser,
                     own: set[str]) -> Iterator[str]:
    subcommands = {name: sub for name, sub in _subcommands(parser).items()
                   if f"{command} {name}" not in own}
    arguments = [a for a in parser._actions
                 if not isinstance(a, argparse._SubParsersAction | argparse._HelpAction)]
    if arguments or not subcommands:
        yield f"## `{command}`\n"
        if parser.description:
            yield " ".join(parser.description.split()) + "\n"
        yield f"```text\n{parser.format_usage().strip()}\n```\n"
        if arguments:
            yield "| argument | meaning |\n|---|---|"
            yield from (f"| {_invocation(a)} | {_cell(_help(a))} |" for a in arguments)
            yield ""
        if parser.epilog:
            yield " ".join(parser.epilog.split()) + "\n"
    for name, sub in subcommands.items():
        yield from _command_section(f"{command} {name}", sub, own)


def cli_page() -> str:
    """The command-line reference: every command, from the parsers in ``PARSERS``."""
    own = {name for name, *_ in PARSERS}
    lines = ["# Command line", "",
             "Generated when the site is built from the `kasper` command's argparse "
             "parsers, so it says what `kasper ... --help` says. How to run and operate a "
             "processor with them: [Operations](../operations.md).", ""]
    for command, *_ in PARSERS:
        lines.extend(_command_section(command, build_parser(command), own))
    return "\n".join(lines) + "\n"
