"""``python -m kasper_py.reprocess`` / ``kasper reprocess`` / ``spark-submit``: run a
processor factory over a range of history. Configuration comes as for ``kasper run``
(TOML, then ``KASPER_*`` variables, then flags); exit codes are the CLI's:
0 ok, 1 the job failed, 2 usage, 3 bad configuration, input topics or range, 4 Kafka
unreachable, 5 handoff refused (the live group is active).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from kasper_py.cli.base import (
    EXIT_BROKER,
    EXIT_CONFIG,
    EXIT_REFUSED,
    ExitCodes,
    load_target,
    run_command,
)
from kasper_py.cli.spark import spark_config, spark_parser
from kasper_py.kafka import positions
from kasper_py.reprocess._handoff import HandoffRefusedError
from kasper_py.reprocess._job import reprocess, resolve_range
from kasper_py.reprocess._kafka import BrokerUnreachableError
from kasper_py.spark.range import Position, RangeError
from kasper_py.spark.session import session_for, ship_target, submitted_session

__all__ = ["main", "parse_position"]

_EXIT_CODES: ExitCodes = ((RangeError, EXIT_CONFIG), (ImportError, EXIT_CONFIG),
                          (HandoffRefusedError, EXIT_REFUSED),
                          (BrokerUnreachableError, EXIT_BROKER))


def parse_position(text: str) -> Position:
    """``earliest``, ``latest``, an ISO-8601 time (UTC without a zone), epoch
    milliseconds, or explicit offsets ``topic:partition=offset[,...]``."""
    try:
        return positions.parse_position(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parser(prog: str) -> argparse.ArgumentParser:
    return spark_parser(prog, "Run a processor over a range of the input topics' history "
                        "with Spark, and optionally hand the end offsets to the live loop's "
                        "group.", _add_arguments)


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--start", type=parse_position, default="earliest", metavar="WHERE",
                        help="earliest (default), an ISO-8601 time, epoch ms, or "
                             "topic:partition=offset[,...]")
    parser.add_argument("--end", type=parse_position, default="latest", metavar="WHERE",
                        help="latest (default), a time, or offsets; the end is not processed")
    parser.add_argument("--output", choices=("kafka", "stores"), default="kafka",
                        help="kafka: produce what process() sends (default); stores: only "
                             "write the stores")
    parser.add_argument("--handoff", action="store_true",
                        help="on success, commit the end offsets to the live group")
    parser.add_argument("--force", action="store_true",
                        help="hand off even if the live group looks active")
    parser.add_argument("--dry-run", action="store_true", help="print the range, run nothing")


def main(argv: Sequence[str] | None = None, prog: str = "python -m kasper_py.reprocess") -> int:
    """Run the command line; returns the exit code."""
    return run_command(_parser(prog), _run, argv, prog, _EXIT_CODES)


def _run(args: argparse.Namespace) -> int:
    config = spark_config(args)
    if args.dry_run:
        print(resolve_range(config, args.start, args.end).describe())
        return 0
    factory, stores = load_target(args, config)
    spark = submitted_session(args.master)
    try:
        with session_for(spark) as session:
            ship_target(session, args)
            result = reprocess(config, factory, start=args.start, end=args.end,
                               stores=stores, output=args.output, handoff=args.handoff,
                               force=args.force, spark=session,
                               kafka_options=dict(args.kafka_option))
    finally:
        if spark is not None:
            spark.stop()
    _summary(result, config.group)
    return 0


def _summary(result: Any, group: str) -> None:
    rate = result.messages / result.seconds if result.seconds else 0.0
    print(f"reprocessed {result.messages} messages in {result.seconds:.1f} s "
          f"({rate:,.0f} msgs/s), produced {result.produced}"
          + (f", set aside {result.undecodable} undecodable" if result.undecodable else ""),
          flush=True)
    if result.handed_off:
        ends = ", ".join(f"{t}[{p}] {o}" for (t, p), o in sorted(result.range.ends.items()))
        print(f"group {group} resumes at {ends}", flush=True)
