"""``kasper app``: an application's topology (``describe``): its processors in turn
order, what each reads, sends to and stores, the topics it owns and its channels."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from kasper_py.app import App, describe
from kasper_py.cli.base import (
    EXIT_CONFIG,
    EXIT_OK,
    CliError,
    add_target_arguments,
    load_attr,
)
from kasper_py.config import Config

__all__ = ["add_app_parsers", "app_command", "load_app"]


def add_app_parsers(commands: Any, add_config_flags: Callable[[argparse.ArgumentParser], None]
                    ) -> None:
    """``kasper app describe``."""
    app = commands.add_parser("app", help="describe an application (see `kasper app -h`)")
    actions = app.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = actions.add_parser("describe", help="print an app's processors, inputs, outputs, "
                              "internal topics, channels, stores and tasks")
    add_target_arguments(show)
    show.add_argument("--json", action="store_true", help="print it as JSON")
    add_config_flags(show)


def app_command(config: Config, args: argparse.Namespace) -> int:
    """Run ``kasper app ACTION``."""
    app = load_app(args)
    topology = describe(app, config)
    if args.json:
        print(json.dumps(topology, indent=2))
    else:
        print(render(topology))
    return EXIT_OK


def load_app(args: argparse.Namespace) -> App:
    """The ``App`` the command's target names; ``CliError(EXIT_CONFIG)`` for another."""
    found = load_attr(args.target, args.app_dir, "target")
    if not isinstance(found, App):
        raise CliError(EXIT_CONFIG, f"target {args.target!r} is not an App "
                       f"(kasper_py.app.App), but a {type(found).__name__}")
    return found


def render(topology: dict[str, Any]) -> str:
    """``describe``'s data as the text ``kasper app describe`` prints."""
    lines = [f"app {topology['app']} (Config.name {topology['name']})",
             f"  sources: {', '.join(topology['sources'])}"]
    for index, node in enumerate(topology["processors"], 1):
        lines.append(f"  {index}. processor {node['name']}")
        lines.append(f"       inputs:  {', '.join(node['inputs'])}")
        if node["outputs"]:
            lines.append(f"       outputs: {', '.join(node['outputs'])}")
        if node["stores"]:
            stores = ", ".join(f"{s['name']} ({s['kind']})" for s in node["stores"])
            lines.append(f"       stores:  {stores}")
    if topology["internal_topics"]:
        lines.append(f"  internal topics: {', '.join(topology['internal_topics'])}")
    if topology["channels"]:
        lines.append(f"  channels: {', '.join(topology['channels'])}")
    for task in topology["tasks"]:
        lines.append(f"  task {task['name']}{' (on leader)' if task['on_leader'] else ''}")
    return "\n".join(lines)
