"""``python -m kasper_py.reprocess`` / ``kasper reprocess`` / ``spark-submit``: run a
processor factory over a range of history. Configuration comes as for ``kasper run``
(TOML, then ``KASPER_*`` variables, then flags); exit codes are the CLI's:
0 ok, 1 the job failed, 2 usage, 3 bad configuration, input topics or range, 4 Kafka
unreachable, 5 handoff refused (the live group is active).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from kasper_py.exceptions import ReprocessError, TopicError
from kasper_py.reprocess._handoff import HandoffRefusedError
from kasper_py.reprocess._kafka import BrokerUnreachableError
from kasper_py.reprocess._range import Position, RangeError

__all__ = ["main", "parse_position"]

_CONFIG_FLAGS: dict[str, tuple[Any, str]] = {
    "name": (str, "processor name (its group and store prefix by default)"),
    "bootstrap_servers": (str, "Kafka bootstrap servers, host:port[,...]"),
    "input_topics": (lambda s: [t for t in s.split(",") if t], "comma-separated input topics"),
    "input_partitions": (lambda s: [int(p) for p in s.split(",") if p],
                         "comma-separated partition numbers (default: all)"),
    "group_id": (str, "the live loop's consumer group (default: the name)"),
    "batch_size": (int, "messages per batch given to process()"),
}


def parse_position(text: str) -> Position:
    """``earliest``, ``latest``, an ISO-8601 time (UTC without a zone), epoch
    milliseconds, or explicit offsets ``topic:partition=offset[,...]``."""
    text = text.strip()
    if text in ("earliest", "latest"):
        return text  # type: ignore[return-value]
    if text.isdigit():
        return datetime.fromtimestamp(int(text) / 1000, tz=UTC)
    if "=" in text:
        return _offsets(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not earliest, latest, an ISO-8601 time, epoch milliseconds or "
            "topic:partition=offset[,...]") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _offsets(text: str) -> dict[tuple[str, int], int]:
    offsets = {}
    for item in (part.strip() for part in text.split(",") if part.strip()):
        where, _, offset = item.partition("=")
        topic, _, partition = where.rpartition(":")
        if not topic or not partition.isdigit() or not offset.strip().isdigit():
            raise argparse.ArgumentTypeError(
                f"{item!r} is not topic:partition=offset (e.g. events:0=1500)")
        offsets[topic, int(partition)] = int(offset)
    return offsets


def _option(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=(
        "Run a processor over a range of the input topics' history with Spark, and "
        "optionally hand the end offsets to the live loop's group."))
    parser.add_argument("target", help="module:factory, a ProcessorFactory (or processor class)")
    parser.add_argument("--stores", metavar="MODULE:ATTR",
                        help="StoreSpecs to open: a sequence, or a callable taking the Config")
    parser.add_argument("--app-dir", default=".", help="prepended to sys.path (default: .)")
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
    parser.add_argument("--master", help="Spark master (default: spark-submit's, else local[2])")
    parser.add_argument("--kafka-option", type=_option, action="append", default=[],
                        metavar="KEY=VALUE", help="Spark Kafka reader option, e.g. "
                        "kafka.security.protocol=SASL_SSL (repeatable)")
    _add_config_flags(parser)
    return parser


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", "-c", metavar="FILE", help="TOML file of Config fields")
    for name, (parse, text) in _CONFIG_FLAGS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=parse, help=text)
    parser.add_argument("--log-format", choices=("auto", "json", "console"), default="auto",
                        help="auto: JSON unless stderr is a terminal")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")


def main(argv: Sequence[str] | None = None, prog: str = "python -m kasper_py.reprocess") -> int:
    """Run the command line; returns the exit code."""
    from kasper_py import cli  # noqa: PLC0415 - shares the CLI's config loading

    args = _parser(prog).parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        return _run(args)
    except (cli.CliError, ReprocessError, TopicError, ImportError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr, flush=True)
        return _exit_code(exc)


def _exit_code(error: Exception) -> int:
    from kasper_py import cli  # noqa: PLC0415

    if isinstance(error, cli.CliError):
        return error.code
    codes = ((RangeError, cli.EXIT_CONFIG), (TopicError, cli.EXIT_CONFIG),
             (ImportError, cli.EXIT_CONFIG),
             (HandoffRefusedError, cli.EXIT_REFUSED), (BrokerUnreachableError, cli.EXIT_BROKER))
    return next((code for kind, code in codes if isinstance(error, kind)), cli.EXIT_FAILED)


def _run(args: argparse.Namespace) -> int:
    from kasper_py import cli  # noqa: PLC0415
    from kasper_py.logging import configure_logging  # noqa: PLC0415
    from kasper_py.reprocess._job import reprocess, resolve_range  # noqa: PLC0415

    configure_logging(json={"auto": None, "json": True, "console": False}[args.log_format],
                      level=args.log_level)
    config = cli.load_config(args.config, os.environ,
                             {name: getattr(args, name) for name in _CONFIG_FLAGS})
    if args.dry_run:
        print(resolve_range(config, args.start, args.end).describe())
        return 0
    factory = cli._load_attr(args.target, args.app_dir, "target")
    stores = cli._load_stores(args.stores, args.app_dir, config) if args.stores else []
    spark = _session(args.master)
    try:
        result = reprocess(config, factory, start=args.start, end=args.end, stores=stores,
                           output=args.output, handoff=args.handoff, force=args.force,
                           spark=spark, kafka_options=dict(args.kafka_option))
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


def _session(master: str | None) -> Any:
    """The session to run on, stopped by the caller: spark-submit's (it set the master
    and the jars), one for ``--master``, or ``None`` for reprocess()'s local[2] one."""
    from kasper_py.reprocess._spark import require_pyspark, spark_session  # noqa: PLC0415

    if master is not None:
        return spark_session(master)
    if os.environ.get("PYSPARK_GATEWAY_PORT"):  # set by spark-submit for its driver
        return require_pyspark().builder.getOrCreate()
    return None
