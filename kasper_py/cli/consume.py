"""``kasper consume TOPIC``: print a topic's records, decoded with the project's serdes
(the registry formats included), as text or JSON lines, from the beginning, the end, an
offset or a time, up to the end as it was at the start or ``--follow``ing. Its consumer
is assigned partitions and never joins a group nor commits. Writing is ``produce``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from kasper_py.cli.base import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    print_error,
)
from kasper_py.cli.connection import (
    EPILOG,
    add_record_flags,
    client_config,
    record_serdes,
    render,
    run_printing,
    topic_admin_for,
    topic_partitions,
)
from kasper_py.config import Config
from kasper_py.exceptions import ConsumeError, SerdeError
from kasper_py.kafka.admin import KafkaAdmin
from kasper_py.kafka.client_log import with_client_log
from kasper_py.observability.logging import configure_logging
from kasper_py.serdes import Serde

__all__ = ["main"]

_PROG = "kasper consume"
_POLL = 0.5


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=_PROG, epilog=EPILOG, description="Print TOPIC's records, one line each, "
        "partition by partition in offset order, and stop at the end each partition had "
        "when the command started (--follow: keep reading until Ctrl-C). Never joins a "
        "consumer group and commits nothing. A record that cannot be decoded is named "
        "on stderr (partition, offset, the serde's error): the command stops there, "
        "exit 1, unless --skip-errors.")
    parser.add_argument("topic", metavar="TOPIC")
    parser.add_argument("--from", dest="start", default="beginning", metavar="WHERE",
                        help="beginning (default), end, an OFFSET (in every partition read) "
                             "or an ISO 8601 time, e.g. 2026-11-26T09:30:00Z (UTC when it "
                             "has no offset): the first record at or after it")
    parser.add_argument("--partition", "-p", type=int, action="append", metavar="N",
                        help="read partition N only (repeat for more; default: all)")
    parser.add_argument("--isolation", choices=("read_committed", "read_uncommitted"),
                        default="read_committed",
                        help="read_committed (default, as processors read): records of "
                             "open or aborted transactions are not shown; "
                             "read_uncommitted: every record written")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--keys", "-k", action="store_true",
                        help="print KEY<TAB>VALUE (default: the value alone)")
    output.add_argument("--json", action="store_true",
                        help="print a JSON object per record: topic, partition, offset, "
                             "timestamp (ms), key, value, headers ([[name, text], ...])")
    parser.add_argument("--follow", "-f", action="store_true",
                        help="keep reading new records until Ctrl-C")
    parser.add_argument("--max", type=int, metavar="N", help="stop after N records")
    parser.add_argument("--skip-errors", action="store_true",
                        help="report an undecodable record on stderr and go on (exit 0)")
    add_record_flags(parser, writing=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``kasper consume``; returns the exit code."""
    return run_printing(_parser(), _run, argv, _PROG)


@dataclass
class _Reading:
    """Where each partition starts, where it ends (the high watermarks at the start,
    the last stable offsets under read_committed) and what is left to read."""

    starts: dict[int, int]
    ends: dict[int, int]
    open: set[int]


def _run(args: argparse.Namespace) -> int:
    configure_logging(level="WARNING")
    if args.max is not None and args.max < 1:
        raise CliError(EXIT_USAGE, f"--max must be at least 1, got {args.max}")
    config = client_config(args, args.topic)
    committed = args.isolation == "read_committed"
    with topic_admin_for(config, args.timeout, consumer=True, read_committed=committed) as admin:
        reading = _positions(admin, config, args)
    serdes = record_serdes(config, args.topic)
    if args.max == 0 or (not reading.open and not args.follow):
        return EXIT_OK
    consumer = Consumer(_consumer_conf(config, args.isolation))
    try:
        consumer.assign([TopicPartition(args.topic, p, reading.starts[p])
                         for p in sorted(reading.starts)])
        return _read(consumer, reading, serdes, args)
    except KeyboardInterrupt:  # Ctrl-C is how --follow ends; otherwise it cut the read
        return EXIT_OK if args.follow else EXIT_INTERRUPTED
    finally:
        consumer.close()


def _positions(admin: KafkaAdmin, config: Config, args: argparse.Namespace) -> _Reading:
    """The partitions to read with their start and end offsets."""
    meta = topic_partitions(admin, config, args.topic)
    wanted = sorted(set(args.partition or meta.partitions))
    missing = [p for p in wanted if p not in meta.partitions]
    if missing:
        raise CliError(EXIT_USAGE, f"--partition {missing[0]}: topic {args.topic!r} has "
                       f"partitions 0..{len(meta.partitions) - 1}")
    marks = admin.watermarks((args.topic, p) for p in wanted)
    start = _start(args.start)
    if isinstance(start, datetime):
        found = admin.offsets_at(int(start.timestamp() * 1000), marks)
        starts = {p: found[args.topic, p] for p in wanted}
    else:
        starts = {p: _offset(start, *marks[args.topic, p]) for p in wanted}
    ends = {p: marks[args.topic, p][1] for p in wanted}
    return _Reading(starts, ends, {p for p in wanted if starts[p] < ends[p]})


def _offset(start: str | int, low: int, high: int) -> int:
    """The first offset to read: ``low`` from the beginning, ``high`` from the end, an
    offset the retention deleted already the first one kept."""
    if start == "beginning":
        return low
    return high if start == "end" else max(low, int(start))


def _start(text: str) -> str | int | datetime:
    """``--from``: ``beginning``, ``end``, an offset or a time (UTC unless it says)."""
    if text in ("beginning", "end"):
        return text
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise CliError(EXIT_USAGE, "--from takes beginning, end, an offset or an ISO 8601 "
                       f"time (2026-11-26T09:30:00Z), got {text!r}") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _consumer_conf(config: Config, isolation: str) -> dict[str, Any]:
    conf = {**config.to_consumer_conf(), "group.id": "kasper-cli-consume",
            "client.id": "kasper-cli-consume", "enable.auto.commit": False,
            "enable.auto.offset.store": False, "enable.partition.eof": True,
            "isolation.level": isolation, "auto.offset.reset": "earliest"}
    return with_client_log(conf, config.name, "consumer")


def _read(consumer: Any, reading: _Reading, serdes: tuple[Serde, Serde],
          args: argparse.Namespace) -> int:
    """Print records until every partition reached its end (or ``--max``); without
    ``--skip-errors`` the first undecodable record stops it, exit 1."""
    printed = skipped = 0
    while args.follow or reading.open:
        for message in consumer.consume(500, _POLL):
            error = message.error()
            partition = message.partition()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    raise ConsumeError(f"reading {args.topic!r}[{partition}] failed: "
                                       f"{error.str()}")
                if message.offset() >= reading.ends[partition]:
                    reading.open.discard(partition)
                continue
            offset = message.offset()
            if not args.follow:
                if offset >= reading.ends[partition]:
                    continue
                if offset + 1 >= reading.ends[partition]:
                    reading.open.discard(partition)
            try:
                line = _line(message, serdes, args)
            except SerdeError as exc:
                print_error(_PROG, f"{args.topic}[{partition}] offset {offset}: {exc}")
                if not args.skip_errors:
                    sys.stdout.flush()
                    return EXIT_FAILED
                skipped += 1
                continue
            print(line, flush=args.follow)
            printed += 1
            if args.max is not None and printed >= args.max:
                return EXIT_OK
    if skipped:
        print_error(_PROG, f"{skipped} undecodable record{'s' if skipped > 1 else ''} "
                    "skipped")
    return EXIT_OK


def _line(message: Any, serdes: tuple[Serde, Serde], args: argparse.Namespace) -> str:
    key = _decoded(serdes[0], message.key(), "key")
    value = _decoded(serdes[1], message.value(), "value")
    if args.json:
        kind, stamp = message.timestamp()
        headers = [[name, None if text is None else render(text)]
                   for name, text in message.headers() or ()]
        return json.dumps({"topic": message.topic(), "partition": message.partition(),
                           "offset": message.offset(), "timestamp": stamp if kind else None,
                           "key": key, "value": value, "headers": headers},
                          ensure_ascii=False)
    return f"{_text(key)}\t{_text(value)}" if args.keys else _text(value)


def _decoded(serde: Serde, data: bytes | None, part: str) -> Any:
    try:
        return render(serde.decode(data))
    except SerdeError as exc:
        raise SerdeError(f"the {part} cannot be decoded: {exc}") from None


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
