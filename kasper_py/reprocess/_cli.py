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
    add_config_flags,
    add_target_arguments,
    config_from_args,
    load_target,
    run_command,
    setup_logging,
)
from kasper_py.kafka import positions
from kasper_py.reprocess._handoff import HandoffRefusedError
from kasper_py.reprocess._job import reprocess, resolve_range
from kasper_py.reprocess._kafka import BrokerUnreachableError
from kasper_py.spark.range import Position, RangeError
from kasper_py.spark.session import add_spark_arguments, session_for, ship_target, submitted_session

__all__ = ["main", "parse_position"]

# The Config fields a reprocessing run takes as flags (batch_wait and metrics_port are
# the live loop's).
_CONFIG_FLAGS = ("name", "bootstrap_servers", "input_topics", "input_partitions", "group_id",
                 "batch_size")
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
    parser = argparse.ArgumentParser(prog=prog, description=(
        "Run a processor over a range of the input topics' history with Spark, and "
        "optionally hand the end offsets to the live loop's group."))
    add_target_arguments(parser)
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
    add_spark_arguments(parser)
    add_config_flags(parser, _CONFIG_FLAGS)
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "python -m kasper_py.reprocess") -> int:
    """Run the command line; returns the exit code."""
    return run_command(_parser(prog), _run, argv, prog, _EXIT_CODES)


def _run(args: argparse.Namespace) -> int:
    setup_logging(args)
    config = config_from_args(args)
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
