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


def build_batch(records: Sequence[Any], key_serde: Serde, value_serde: Serde) -> Batch:
    """Decode confluent-kafka records into a ``Batch``; errors name topic, partition, offset.

    Raises ``ConsumeError`` for a record carrying an error, ``SerdeError`` for one that
    does not decode, ``OffsetError`` when a topic-partition's offsets go backwards.
    """
    batch = Batch()
    by_partition = batch.by_partition
    ranges = batch.ranges
    decode_key = None if key_serde.name == "bytes" else key_serde.decode
    decode_value = None if value_serde.name == "bytes" else value_serde.decode
    for record in records:
        error = record.error()
        if error is not None:
            raise ConsumeError(
                f"consuming {record.topic()}[{record.partition()}] failed: {error.str()}",
                code=error.code(),
            )
        topic, partition, offset = record.topic(), record.partition(), record.offset()
        key, value = record.key(), record.value()
        if decode_key is not None or decode_value is not None:
            key, value = _decode(record, key, value, decode_key, decode_value)
        ts_type, ts = record.timestamp()
        timestamp = ts if ts_type else None
        headers = record.headers()
        message = Message(
            topic, partition, offset, key, value, timestamp, tuple(headers) if headers else ()
        )
        messages = by_partition.get(partition)
        if messages is None:
            by_partition[partition] = [message]
        else:
            messages.append(message)
        _extend_range(ranges, (topic, partition), offset, timestamp)
    return batch


def _extend_range(
    ranges: dict[TopicPartitionKey, OffsetRange], tp: TopicPartitionKey, offset: int,
    timestamp: int | None,
) -> None:
    current = ranges.get(tp)
    if current is None:
        ranges[tp] = OffsetRange(offset, offset, 1, timestamp, timestamp)
        return
    if offset <= current.last:
        raise OffsetError(
            f"{tp[0]}[{tp[1]}] offset {offset} arrived after {current.last}: offsets went backwards"
        )
    current.last = offset
    current.count += 1
    if timestamp is not None:
        current.last_timestamp = timestamp


def _decode(
    record: Any, key: Any, value: Any,
    decode_key: Callable[[bytes | None], Any] | None,
    decode_value: Callable[[bytes | None], Any] | None,
) -> tuple[Any, Any]:
    try:
        if decode_key is not None:
            key = decode_key(key)
        if decode_value is not None:
            value = decode_value(value)
    except SerdeError as exc:
        raise SerdeError(
            f"cannot decode {record.topic()}[{record.partition()}] offset {record.offset()}: {exc}"
        ) from exc
    return key, value
