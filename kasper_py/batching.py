"""Turning polled records into a ``Batch``: released at ``batch_size`` or
``batch_wait``, decoded, and grouped by partition number across input topics.
No Kafka client is touched here; the consumer hands raw records in.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kasper_py.exceptions import ConsumeError, OffsetError, SerdeError
from kasper_py.message import Message
from kasper_py.serdes import Serde

__all__ = ["Batch", "OffsetRange", "build_batch", "collect"]

TopicPartitionKey = tuple[str, int]


@dataclass
class OffsetRange:
    """First and last offset of one topic-partition in a batch, and its newest timestamp."""

    first: int
    last: int
    count: int = 1
    first_timestamp: int | None = None
    last_timestamp: int | None = None


@dataclass
class Batch:
    """One turn's input: messages per partition number, and the offset range per topic-partition."""

    by_partition: dict[int, list[Message]] = field(default_factory=dict)
    ranges: dict[TopicPartitionKey, OffsetRange] = field(default_factory=dict)

    def __len__(self) -> int:
        return sum(r.count for r in self.ranges.values())

    def describe(self, partition: int | None = None) -> str:
        """``topic[p] offsets a..b`` for every range (or one partition's), for error text."""
        parts = [
            f"{topic}[{p}] offsets {r.first}..{r.last}"
            for (topic, p), r in sorted(self.ranges.items())
            if partition is None or p == partition
        ]
        return ", ".join(parts) or "no messages"

    def next_offsets(self) -> dict[TopicPartitionKey, int]:
        """The offsets to commit: last processed offset + 1 for every topic-partition."""
        return {tp: r.last + 1 for tp, r in self.ranges.items()}


def collect(
    consume: Callable[[int, float], Sequence[Any]],
    batch_size: int,
    batch_wait: float,
    clock: Callable[[], float] = time.monotonic,
) -> list[Any]:
    """Call ``consume(max_count, timeout)`` until ``batch_size`` records or ``batch_wait``
    seconds, whichever comes first, and return the records in arrival order."""
    deadline = clock() + batch_wait
    records: list[Any] = []
    while True:
        remaining = deadline - clock()
        if remaining <= 0:
            return records
        records.extend(consume(batch_size - len(records), remaining))
        if len(records) >= batch_size:
            return records


def build_batch(records: Sequence[Any], key_serde: Serde, value_serde: Serde,
                transient: Callable[[Any], bool] | None = None) -> Batch:
    """Decode confluent-kafka records into a ``Batch``; errors name topic, partition, offset.

    A record carrying an error for which ``transient(record)`` is true (the client
    retries it by itself) is left out; any other raises ``ConsumeError``.

    Messages of one partition number are grouped topic by topic (in the order the
    topics first arrived), each topic's in offset order. Raises ``ConsumeError`` for a
    record carrying an error, ``SerdeError`` for one that does not decode, and
    ``OffsetError`` when a topic-partition's offsets are not increasing.
    """
    decode = key_serde.name != "bytes" or value_serde.name != "bytes"
    by_tp: dict[TopicPartitionKey, list[Message]] = {}
    new = tuple.__new__  # Message is a NamedTuple; this skips its Python-level __new__
    run_topic, run_partition, run = "", -1, []  # records come in runs of one partition
    for record in records:
        if record.error() is not None:
            if transient is not None and transient(record):
                continue
            raise _consume_error(record)
        topic, partition = record.topic(), record.partition()
        key, value = record.key(), record.value()
        if decode:
            key, value = _decode(record, key, value, key_serde, value_serde)
        ts_type, ts = record.timestamp()
        headers = record.headers()
        message = new(Message, (topic, partition, record.offset(), key, value,
                                ts if ts_type else None, tuple(headers) if headers else ()))
        if partition != run_partition or topic != run_topic:
            run_topic, run_partition = topic, partition
            run = by_tp.setdefault((topic, partition), [])
        run.append(message)
    return _group(by_tp)


def _group(by_tp: dict[TopicPartitionKey, list[Message]]) -> Batch:
    batch = Batch()
    for (topic, partition), messages in by_tp.items():
        first, last = messages[0], messages[-1]
        # Offsets are unique and increasing, so n messages span at least n offsets.
        if last.offset - first.offset + 1 < len(messages):
            raise OffsetError(f"{topic}[{partition}] offsets are not increasing within a batch "
                              f"({len(messages)} messages in {first.offset}..{last.offset})")
        batch.ranges[(topic, partition)] = OffsetRange(
            first.offset, last.offset, len(messages), first.timestamp, last.timestamp)
        batch.by_partition.setdefault(partition, []).extend(messages)
    return batch


def _consume_error(record: Any) -> ConsumeError:
    error = record.error()
    return ConsumeError(f"consuming {record.topic()}[{record.partition()}] failed: {error.str()}",
                        code=error.code())


def _decode(record: Any, key: Any, value: Any, key_serde: Serde,
            value_serde: Serde) -> tuple[Any, Any]:
    try:
        key = key_serde.decode(key)
        value = value_serde.decode(value)
    except SerdeError as exc:
        raise SerdeError(
            f"cannot decode {record.topic()}[{record.partition()}] offset {record.offset()}: {exc}"
        ) from exc
    return key, value
