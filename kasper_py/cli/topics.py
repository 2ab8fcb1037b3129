"""``kasper topics create|list|describe|delete``: a cluster's topics from a shell,
through the one topic admin (``KafkaAdmin``: ``ensure`` creates, ``delete_topics``
deletes), so the docs never need ``kafka-topics.sh``. Writing and reading records is
``produce`` and ``consume``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from kasper_py.cli.base import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, CliError
from kasper_py.cli.connection import (
    EPILOG,
    add_connection_flags,
    client_config,
    run_printing,
    topic_admin_for,
    topic_partitions,
)
from kasper_py.exceptions import TopicError
from kasper_py.kafka.topics import TopicSpec, topic_problem
from kasper_py.observability.logging import configure_logging

__all__ = ["main"]

_PROG = "kasper topics"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=_PROG, description="Create, list, describe and delete topics. The TOML file "
        "of Config fields is --config-file here: --config sets a topic setting, as "
        "kafka-topics.sh's does.", epilog=EPILOG)
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="create topics", epilog=EPILOG)
    create.add_argument("topics", nargs="+", metavar="TOPIC")
    create.add_argument("--partitions", "-p", type=int, metavar="N",
                        help="partitions of each (default: the broker's num.partitions)")
    create.add_argument("--replication-factor", "-r", type=int, metavar="N",
                        help="replicas of each partition (default: the broker's "
                             "default.replication.factor)")
    create.add_argument("--config", dest="settings", action="append", default=[],
                        metavar="KEY=VALUE", help="a topic setting, e.g. "
                        "cleanup.policy=compact (repeat for more)")
    create.add_argument("--if-not-exists", action="store_true",
                        help="a topic that exists already is no error (it is left as it is)")
    listing = actions.add_parser("list", help="topic names and partition counts",
                                 epilog=EPILOG)
    listing.add_argument("--all", action="store_true",
                         help="include Kafka's internal topics (names starting with __)")
    describe = actions.add_parser(
        "describe", epilog=EPILOG,
        help="partitions, leaders, replicas, low/high watermarks and settings of its own")
    describe.add_argument("topics", nargs="+", metavar="TOPIC")
    delete = actions.add_parser("delete", help="delete topics and their records",
                                epilog=EPILOG)
    delete.add_argument("topics", nargs="+", metavar="TOPIC")
    delete.add_argument("--yes", "-y", action="store_true",
                        help="delete without asking (without it: asked on a terminal, "
                             "refused otherwise)")
    delete.add_argument("--if-exists", action="store_true",
                        help="a topic that does not exist is no error")
    for sub in (create, listing, describe, delete):
        add_connection_flags(sub, config_flags=("--config-file",))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``kasper topics``; returns the exit code."""
    return run_printing(_parser(), _run, argv, _PROG)


def _run(args: argparse.Namespace) -> int:
    configure_logging(level="WARNING")
    config = client_config(args, (getattr(args, "topics", None) or ["-"])[0])
    admin = topic_admin_for(config, args.timeout, consumer=args.action == "describe")
    with admin:
        if args.action == "create":
            return _create(admin, config, args)
        if args.action == "list":
            return _list(admin, args.all)
        if args.action == "describe":
            return _describe(admin, config, args.topics)
        return _delete(admin, config, args)


def _create(admin: Any, config: Any, args: argparse.Namespace) -> int:
    partitions, replicas = args.partitions, args.replication_factor
    if partitions is not None and partitions < 1:
        raise CliError(EXIT_USAGE, f"--partitions must be at least 1, got {partitions}")
    if replicas is not None and replicas < 1:
        raise CliError(EXIT_USAGE, f"--replication-factor must be at least 1, got {replicas}")
    settings = _settings(args.settings)
    topics = admin.metadata().topics
    existing = [name for name in args.topics if topic_problem(topics.get(name)) is None]
    if existing and not args.if_not_exists:
        raise TopicError(f"topic {existing[0]!r} already exists on "
                         f"{config.bootstrap_servers} (--if-not-exists to accept it)")
    specs = [TopicSpec(name, "output", partitions or -1, "any", replicas or -1, settings)
             for name in dict.fromkeys(args.topics) if name not in existing]
    admin.ensure(specs, metadata=admin.metadata())
    counts = {name: len(meta.partitions) for name, meta in admin.metadata().topics.items()}
    for name in dict.fromkeys(args.topics):
        done = "exists already" if name in existing else "created"
        print(f"{name}: {done}, {_partitions(counts.get(name, 0))}")
    return EXIT_OK


def _partitions(count: int) -> str:
    return f"{count} partition{'' if count == 1 else 's'}"


def _settings(pairs: Sequence[str]) -> dict[str, str]:
    settings = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise CliError(EXIT_USAGE, f"--config takes KEY=VALUE, got {pair!r}")
        settings[key.strip()] = value.strip()
    return settings


def _list(admin: Any, everything: bool) -> int:
    topics = admin.metadata().topics
    names = sorted(name for name in topics if everything or not name.startswith("__"))
    width = max((len(name) for name in names), default=0)
    for name in names:
        print(f"{name.ljust(width)}  {len(topics[name].partitions)}")
    return EXIT_OK


def _describe(admin: Any, config: Any, names: Sequence[str]) -> int:
    for index, name in enumerate(names):
        meta = topic_partitions(admin, config, name)
        numbers = sorted(meta.partitions)
        marks = admin.watermarks((name, p) for p in numbers)
        overrides = admin.topic_overrides(name)
        replicas = len(meta.partitions[numbers[0]].replicas) if numbers else 0
        if index:
            print()
        print(f"topic {name}: {_partitions(len(numbers))}, replication factor {replicas}")
        print("settings: " + (", ".join(f"{k}={v}" for k, v in overrides.items())
                              or "the broker's defaults"))
        rows: list[tuple[str, ...]] = [("partition", "leader", "replicas", "in-sync", "low",
                                         "high")]
        for p in numbers:
            part = meta.partitions[p]
            rows.append((str(p), str(part.leader), ",".join(map(str, part.replicas)),
                         ",".join(map(str, part.isrs)), *map(str, marks[name, p])))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
                  .rstrip())
    return EXIT_OK


def _delete(admin: Any, config: Any, args: argparse.Namespace) -> int:
    topics = admin.metadata().topics
    names = list(dict.fromkeys(args.topics))
    missing = [name for name in names if topic_problem(topics.get(name)) is not None]
    if missing and not args.if_exists:
        raise TopicError(f"topic {missing[0]!r} does not exist on "
                         f"{config.bootstrap_servers} (--if-exists to accept that)")
    present = [name for name in names if name not in missing]
    if present and not args.yes and not _confirmed(present):
        raise CliError(EXIT_REFUSED, f"not deleting {', '.join(map(repr, present))}: "
                       "confirm with --yes")
    deleted = admin.delete_topics(present)
    for name in names:
        print(f"{name}: {'deleted' if name in deleted else 'does not exist'}")
    return EXIT_OK


def _confirmed(names: Sequence[str]) -> bool:
    """Asked on a terminal; never where no one can answer (a script, a pipe)."""
    if not sys.stdin.isatty():
        return False
    answer = input(f"delete {', '.join(map(repr, names))} and every record in them? "
                   "[y/N] ")
    return answer.strip().lower() in ("y", "yes")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
