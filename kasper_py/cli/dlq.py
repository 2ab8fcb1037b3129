"""``kasper dlq replay``: send the dead letters of a processor back, so a fixed processor
takes them again. Reads ``Config.dead_letter_topic`` up to its end as it is when the
command starts, keeps the records the filters select, and produces each one's original
key, value and headers (the ``kasper.*`` headers dropped) to its
``kasper.source.topic`` and partition, or to ``--to``.

Where it starts and ends is read through ``KafkaAdmin`` (with its Kafka errors
mapped). Progress is the replay's own consumer group (``<name>-dlq-replay`` unless
``--group``), committed after each batch is acked: an interrupted replay resumes where
it stopped, and what it had sent but not committed is sent again (at-least-once: a
duplicate per record at most, of the last batch). A rerun after a complete one finds
nothing new; ``--from-offset`` reads again from a given offset.
"""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from kasper_py.cli.base import EXIT_BROKER, EXIT_CONFIG, EXIT_OK, CliError
from kasper_py.cli.offsets import admin_for
from kasper_py.config import Config
from kasper_py.exceptions import AdminError
from kasper_py.kafka.admin import KafkaAdmin, reason
from kasper_py.kafka.topics import topic_problem
from kasper_py.message import TopicPartitionKey

__all__ = ["add_dlq_parser", "replay"]

_BATCH = 1000
_KASPER = "kasper."


def add_dlq_parser(commands: Any, add_config_flags: Any) -> None:
    """``kasper dlq replay`` and its flags (config flags by ``add_config_flags``)."""
    dlq = commands.add_parser("dlq", help="work with the dead-letter topic")
    actions = dlq.add_subparsers(dest="action", required=True, metavar="ACTION")
    parser = actions.add_parser(
        "replay", help="re-send dead letters to their source topic (or --to), filtered")
    parser.add_argument("--to", metavar="TOPIC", help="send every record here instead of "
                        "its kasper.source.topic (the partitioner places it)")
    parser.add_argument("--source-topic", metavar="TOPIC", help="only records from this topic")
    parser.add_argument("--error-type", metavar="TYPE",
                        help="only records whose kasper.error.type is TYPE (e.g. ValueError)")
    parser.add_argument("--source-offsets", type=_offset_range, metavar="FIRST-LAST",
                        help="only records whose kasper.source.offset is in FIRST..LAST")
    parser.add_argument("--from-offset", type=int, metavar="N",
                        help="read every dead-letter partition from offset N, not from where "
                             "the last replay of this group committed")
    parser.add_argument("--group", help="the replay's consumer group "
                        "(default: <name>-dlq-replay)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print what would be sent; send and commit nothing")
    add_config_flags(parser)


def _offset_range(text: str) -> tuple[int, int]:
    first, sep, last = text.partition("-")
    if not sep or not first.isdigit() or not last.isdigit() or int(first) > int(last):
        raise argparse.ArgumentTypeError(f"{text!r} is not FIRST-LAST (e.g. 100-250)")
    return int(first), int(last)


@dataclass
class _Filters:
    source_topic: str | None
    error_type: str | None
    offsets: tuple[int, int] | None

    def keep(self, headers: dict[str, bytes | None]) -> bool:
        def text(name: str) -> str:
            value = headers.get(name)
            return "" if value is None else value.decode(errors="replace")

        if self.source_topic is not None and text("kasper.source.topic") != self.source_topic:
            return False
        if self.error_type is not None and text("kasper.error.type") != self.error_type:
            return False
        offset = text("kasper.source.offset")
        return self.offsets is None or (offset.isdigit()
                                        and self.offsets[0] <= int(offset) <= self.offsets[1])


def replay(config: Config, args: argparse.Namespace) -> int:
    """Run ``kasper dlq replay``; print a line per target and a total."""
    topic = config.dead_letter_topic
    if topic is None:
        raise CliError(EXIT_CONFIG, "config field 'dead_letter_topic': not set, so there is "
                       "no dead-letter topic to replay")
    group = args.group or f"{config.name}-dlq-replay"
    client_id = f"{config.name}-dlq-replay"
    base = config.to_admin_conf()
    consumer = Consumer({**base, "client.id": client_id, "group.id": group,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed", "enable.partition.eof": False})
    # a replay creates no topic, whatever the broker's auto.create.topics.enable
    producer = Producer({**base, "client.id": client_id, "acks": "all",
                         "enable.idempotence": True, "partitioner": "murmur2_random",
                         "allow.auto.create.topics": False})
    filters = _Filters(args.source_topic, args.error_type, args.source_offsets)
    try:
        with admin_for(config, args.connect_timeout, client_id=client_id, group=group,
                       read_committed=True) as admin:
            starts, ends = _range(admin, topic, args.from_offset, args.to)
        consumer.assign([TopicPartition(t, p, o) for (t, p), o in starts.items()])
        sent, skipped = _copy(consumer, producer, ends, filters, args)
    except AdminError as exc:
        raise CliError(EXIT_BROKER, f"replaying {topic}: {reason(exc.__cause__ or exc)}"
                       ) from None
    except KafkaException as exc:
        raise CliError(EXIT_BROKER, f"replaying {topic}: {exc.args[0]}") from None
    finally:
        consumer.close()
    verb = "would send" if args.dry_run else "sent"
    for target, count in sorted(sent.items()):
        print(f"{verb} {count} to {target}")
    print(f"{topic}: {verb} {sum(sent.values())}, {skipped} left out by the filters"
          f"{' (dry run: nothing sent or committed)' if args.dry_run else ''}")
    return EXIT_OK


def _range(admin: KafkaAdmin, topic: str, from_offset: int | None, to: str | None
           ) -> tuple[dict[TopicPartitionKey, int], dict[TopicPartitionKey, int]]:
    """Where the replay starts on each partition of ``topic`` (the replay group's
    committed offset, or ``from_offset``) and its end now, for the partitions with
    anything to read; ``to``, when given, must name a topic that exists."""
    if to is not None:
        problem = topic_problem(admin.metadata(to).topics.get(to))
        if problem is not None:
            raise CliError(EXIT_CONFIG, f"--to topic {to!r}: {problem}")
    metadata = admin.metadata(topic).topics.get(topic)
    if metadata is None or metadata.error is not None:
        raise CliError(EXIT_CONFIG, f"dead-letter topic {topic!r} does not exist")
    keys = [(topic, p) for p in sorted(metadata.partitions)]
    committed = admin.committed(keys)
    starts: dict[TopicPartitionKey, int] = {}
    ends: dict[TopicPartitionKey, int] = {}
    for key, (low, high) in admin.watermarks(keys).items():
        start = from_offset if from_offset is not None else committed.get(key)
        start = max(start if start is not None and start >= 0 else low, low)
        if start < high:
            starts[key], ends[key] = start, high
    return starts, ends


def _copy(consumer: Any, producer: Any, ends: dict[TopicPartitionKey, int], filters: _Filters,
          args: argparse.Namespace) -> tuple[Counter[str], int]:
    """Read to ``ends``, sending what the filters keep; commit each batch once acked."""
    sent: Counter[str] = Counter()
    skipped = 0
    errors: list[str] = []
    while ends:
        positions: dict[TopicPartitionKey, int] = {}
        for record in consumer.consume(_BATCH, 1.0):
            if record.error() is not None:
                raise KafkaException(record.error())
            if record.offset() >= ends.get((record.topic(), record.partition()), -1):
                continue
            positions[(record.topic(), record.partition())] = record.offset() + 1
            target = _send(producer, record, filters, args, errors)
            if target is None:
                skipped += 1
            else:
                sent[target] += 1
        _checkpoint(consumer, producer, positions, errors, args.dry_run)
        # the position, not the last record: a transactional topic ends in a marker
        for tp in consumer.position([TopicPartition(t, p) for t, p in ends]):
            if tp.offset >= ends[(tp.topic, tp.partition)]:
                del ends[(tp.topic, tp.partition)]
    return sent, skipped


def _send(producer: Any, record: Any, filters: _Filters, args: argparse.Namespace,
          errors: list[str]) -> str | None:
    """Produce one dead letter back (unless a dry run); its target, or None if left out."""
    headers = list(record.headers() or ())
    named = dict(headers)
    if not filters.keep(named):
        return None
    source = named.get("kasper.source.topic")
    target: str | None = args.to or (source.decode() if source else None)
    if target is None:
        return None  # not a kasper dead letter: nowhere to send it
    partition = named.get("kasper.source.partition")
    kwargs: dict[str, Any] = {}
    if args.to is None and partition is not None and partition.isdigit():
        kwargs["partition"] = int(partition)
    if not args.dry_run:
        producer.produce(target, record.value(), record.key(),
                         headers=[(k, v) for k, v in headers if not k.startswith(_KASPER)],
                         on_delivery=lambda err, _m: _note(errors, err), **kwargs)
        producer.poll(0)
    return target


def _note(errors: list[str], error: Any) -> None:
    if error is not None:
        errors.append(error.str())


def _checkpoint(consumer: Any, producer: Any, positions: dict[TopicPartitionKey, int],
                errors: list[str], dry_run: bool) -> None:
    """Wait for every ack, then commit how far the replay got."""
    if dry_run or not positions:
        return
    producer.flush()
    if errors:
        raise CliError(EXIT_BROKER, f"a replayed record was not delivered: {errors[0]}; "
                       "this batch is not committed, a rerun sends it again")
    consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in positions.items()],
                    asynchronous=False)
