"""``kasper produce TOPIC``: write records from lines of stdin or a file, encoded with the
project's serdes (the registry formats included), with the producer every processor
writes with (``Config.to_producer_conf``: acks=all, idempotent, murmur2 partitioning),
and wait for every ack. Reading them back is ``consume``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator, Sequence
from typing import IO, Any

from confluent_kafka import KafkaError, Producer

from kasper_py._support.names import resolve_name
from kasper_py.cli.base import EXIT_OK, EXIT_USAGE, CliError
from kasper_py.cli.connection import (
    EPILOG,
    add_record_flags,
    client_config,
    record_serdes,
    run_printing,
    topic_admin_for,
    topic_partitions,
)
from kasper_py.config import Config
from kasper_py.exceptions import ProduceError, SerdeError
from kasper_py.kafka.client_log import with_client_log
from kasper_py.observability.logging import configure_logging
from kasper_py.registry import ProtobufSerde
from kasper_py.serdes import Serde

__all__ = ["main"]

_PROG = "kasper produce"
Record = tuple[Any, Any, list[tuple[str, str | bytes | None]] | None]
"""A line's key, value (as the serde takes them) and headers."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=_PROG, epilog=EPILOG, description="Write one record per line of stdin (or "
        "--file) to TOPIC and wait until the broker has acknowledged every one. Empty "
        "lines are skipped. A keyed record goes to the partition of murmur2(key), as "
        "the Java client and kasper_py's own producer place it, so kasper query and "
        "partition-wise joins find it; an unkeyed one to any partition. Text lines "
        "are the value as is for str and bytes, JSON text for json and the registry "
        "formats (an avro or json_schema record as a JSON object, a protobuf message "
        "in protobuf's JSON mapping).")
    parser.add_argument("topic", metavar="TOPIC")
    parser.add_argument("--file", "-f", metavar="FILE", help="read FILE instead of stdin")
    shape = parser.add_mutually_exclusive_group()
    shape.add_argument("--key-separator", "-k", metavar="SEP",
                       help="each line is KEY SEP VALUE, split at the first SEP "
                            "(e.g. ':'); a line without SEP is an error")
    shape.add_argument("--json", action="store_true",
                       help='each line is a JSON object {"key": ..., "value": ..., '
                            '"headers": {"name": "text", ...}}, key and headers optional; '
                            "key and value are JSON values handed to their serdes")
    parser.add_argument("--partition", "-p", type=int, metavar="N",
                        help="write every record to partition N (default: by key)")
    add_record_flags(parser, writing=True)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``kasper produce``; returns the exit code."""
    return run_printing(_parser(), _run, argv, _PROG)


def _run(args: argparse.Namespace) -> int:
    configure_logging(level="WARNING")
    config = client_config(args, args.topic)
    with topic_admin_for(config, args.timeout) as admin:
        meta = topic_partitions(admin, config, args.topic)
    if args.partition is not None and args.partition not in meta.partitions:
        raise CliError(EXIT_USAGE, f"--partition {args.partition}: topic {args.topic!r} "
                       f"has partitions 0..{len(meta.partitions) - 1}")
    serdes = record_serdes(config, args.topic)
    writer = _Writer(config, args.topic, -1 if args.partition is None else args.partition)
    source = open(args.file, encoding="utf-8") if args.file else sys.stdin  # noqa: SIM115
    try:
        for number, line in _lines(source, args.file):
            try:
                key, value, headers = _record(line, args, serdes[0], serdes[1])
                writer.write(serdes[0].encode(key), serdes[1].encode(value), headers)
            except SerdeError as exc:
                writer.finish()
                raise SerdeError(f"line {number}: {exc}; {writer.report()}") from None
    finally:
        if args.file:
            source.close()
    writer.finish()
    print(writer.report())
    return EXIT_OK


def _lines(source: IO[str], name: str | None) -> Iterator[tuple[int, str]]:
    """The non-empty lines with their numbers (from 1), the newline removed."""
    try:
        for number, line in enumerate(source, 1):
            text = line.rstrip("\r\n")
            if text:
                yield number, text
    except UnicodeDecodeError as exc:
        raise SerdeError(f"{name or 'stdin'} is not UTF-8 text: {exc}") from None


def _record(line: str, args: argparse.Namespace, key_serde: Serde, value_serde: Serde
            ) -> Record:
    """The record of one line; ``SerdeError`` saying what is wrong with it."""
    if args.json:
        return _json_record(line, key_serde, value_serde)
    key = None
    if args.key_separator is not None:
        key, sep, value = line.partition(args.key_separator)
        if not sep:
            raise SerdeError(f"no key separator {args.key_separator!r} in {line[:80]!r}")
        return _from_text(key, key_serde, "key"), _from_text(value, value_serde, "value"), None
    return key, _from_text(line, value_serde, "value"), None


def _json_record(line: str, key_serde: Serde, value_serde: Serde) -> Record:
    try:
        record = json.loads(line)
    except ValueError as exc:
        raise SerdeError(f"not a JSON object: {exc}") from None
    if not isinstance(record, dict) or "value" not in record \
            or set(record) - {"key", "value", "headers"}:
        raise SerdeError('each line must be a JSON object {"key": ..., "value": ..., '
                         f'"headers": {{...}}}} (value required), got {line[:80]!r}')
    return (_from_json(record.get("key"), key_serde), _from_json(record["value"], value_serde),
            _headers(record.get("headers")))


def _from_text(text: str, serde: Serde, part: str) -> Any:
    """A text line's key or value as ``serde`` takes it (see the parser's description)."""
    if serde.name in ("str", "bytes"):
        return text if serde.name == "str" else text.encode()
    try:
        return _from_json(json.loads(text), serde)
    except ValueError as exc:
        raise SerdeError(f"the {part} is not JSON, as the {serde.name} serde takes it "
                         f"here ({exc}): {text[:80]!r}") from None


def _from_json(value: Any, serde: Serde) -> Any:
    """A JSON value as ``serde`` takes it: text as bytes for bytes, a protobuf message
    from its JSON mapping; anything else as it is (the serde refuses what does not fit)."""
    if serde.name == "bytes" and isinstance(value, str):
        return value.encode()
    if isinstance(serde, ProtobufSerde) and value is not None:
        from google.protobuf.json_format import (  # type: ignore[import-untyped]  # noqa: PLC0415
            ParseDict,
            ParseError,
        )

        try:
            return ParseDict(value, resolve_name(str(serde.schema))())
        except (ParseError, TypeError, AttributeError) as exc:
            raise SerdeError(f"protobuf serde: not a {serde.schema}: {exc}") from None
    return value


def _headers(headers: Any) -> list[tuple[str, str | bytes | None]] | None:
    """``{"name": "text"}`` or ``[["name", "text"], ...]`` (names may repeat) as Kafka
    headers, the texts as UTF-8."""
    if headers is None:
        return None
    pairs = headers.items() if isinstance(headers, dict) else headers
    try:
        return [(str(name), None if text is None else str(text).encode())
                for name, text in pairs]
    except (TypeError, ValueError):
        raise SerdeError('headers must be {"name": "text", ...} or [["name", "text"], ...], '
                         f"got {headers!r}") from None


class _Writer:
    """One producer (the processors' settings), counting the records handed to it and
    keeping the first delivery error."""

    def __init__(self, config: Config, topic: str, partition: int) -> None:
        conf = with_client_log(config.to_producer_conf(), config.name, "producer")
        self._producer = Producer({**conf, "on_delivery": self._on_delivery})
        self._topic, self._partition, self._timeout = topic, partition, config.delivery_timeout
        self.sent, self.failed = 0, 0
        self._error: KafkaError | None = None

    def write(self, key: bytes | None, value: bytes | None,
              headers: list[tuple[str, str | bytes | None]] | None) -> None:
        while True:
            try:
                self._producer.produce(self._topic, value, key, self._partition,
                                       headers=headers)
                break
            except BufferError:  # the local queue is full: wait for acks
                self._producer.poll(0.1)
        self.sent += 1
        self._producer.poll(0)

    def finish(self) -> None:
        """Wait for every ack (up to ``delivery_timeout``); ``ProduceError`` with the
        first failure and how many records were written."""
        deadline = time.monotonic() + self._timeout + 5
        while self._producer.flush(1.0) and time.monotonic() < deadline:
            pass
        waiting = len(self._producer)
        if self._error is not None or waiting:
            cause = self._error.str() if self._error is not None else "no ack in time"
            raise ProduceError(f"producing to {self._topic!r} failed: {cause}; "
                               f"{self.report(waiting)}")

    def report(self, waiting: int = 0) -> str:
        written = self.sent - self.failed - waiting
        return f"{written} record{'' if written == 1 else 's'} written to {self._topic}"

    def _on_delivery(self, error: KafkaError | None, _message: Any) -> None:
        if error is not None:
            self.failed += 1
            self._error = self._error or error


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
