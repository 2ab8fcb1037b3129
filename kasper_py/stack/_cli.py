"""The ``up | down | status | spark-jars | images`` command line (``kasper stack``)."""

from __future__ import annotations

import argparse
import sys

from kasper_py.stack import _lifecycle
from kasper_py.stack._catalog import COMPONENTS, GROUPS
from kasper_py.stack._errors import StackError
from kasper_py.stack._image_build import build_images
from kasper_py.stack._images import IMAGES
from kasper_py.stack._settings import Settings
from kasper_py.stack._spark import spark_jars

_NAMES = f"{', '.join([*COMPONENTS, *GROUPS])} (master and workers) or all"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m kasper_py.stack",
        description="Run Kafka, Redis, Cassandra, Prometheus, a Spark standalone "
                    "cluster, Jaeger, PostgreSQL and a container engine (Podman) as local "
                    "processes.",
    )
    parser.add_argument("--stack-dir", help="default: $KASPER_STACK_DIR, else a .kasper-stack "
                        "in the current folder or one above it, else the stack last started "
                        "(recorded per user), else ./.kasper-stack")
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("up", help="start components (default: kafka redis)")
    start.add_argument("components", nargs="*", help=_NAMES)
    stop = commands.add_parser("down", help="stop components (default: all)")
    stop.add_argument("components", nargs="*", help=_NAMES)
    stop.add_argument("--purge", action="store_true", help="also delete their data and logs")
    commands.add_parser("status", help="show what runs where")
    commands.add_parser("spark-jars", help="resolve the Spark Kafka connector jars, print paths")
    images = commands.add_parser("images", help="build the container images from Debian's "
                                 "packages and Maven Central, unless they exist")
    images.add_argument("images", nargs="*", help=f"{', '.join(IMAGES)} (default: all)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the stack command line; returns the process exit code."""
    args = _parser().parse_args(argv)
    try:
        _dispatch(args, Settings.load(args.stack_dir))
    except StackError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        return 1
    return 0


def _dispatch(args: argparse.Namespace, settings: Settings) -> None:
    def report(line: str) -> None:
        print(line, flush=True)

    if args.command == "up":
        _lifecycle.up(args.components, settings, report)
    elif args.command == "down":
        _lifecycle.down(args.components, settings, args.purge, report)
    elif args.command == "status":
        for component in _lifecycle.status(settings):
            report(str(component))
    elif args.command == "images":
        build_images(settings, report, args.images)
    else:
        for jar in spark_jars(settings.stack_dir):
            report(jar)
