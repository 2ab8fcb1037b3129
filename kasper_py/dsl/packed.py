"""Packed repartition records (public for readers of the topics other than the app, and
for tests: ``unpack``, ``unpacked``): a DSL stage writes a turn's records for one repartition
as one Kafka record per destination partition (several when a partition's share is
larger than ``FRAME_CAP``), and the stage reading it expands each back into its records,
in order, before its operators see them. Fewer Kafka records a word is what halves the
hop: producing, acking, consuming and committing cost per Kafka record, not per byte.

A packed record has no key and no value; its one header ``kasper.packed`` holds the
frame, so every serde reads the outer record as it is (a null key and value) and the
loop's batching, offsets and commits see it as any other record. The frame, version 1::

    version  u8 (1)
    count    u32, the records that follow
    record   timestamp i64 (0: the outer record's), key length i32 (-1: None),
             value length i32 (-1: None), header count u16; the key, the value;
             per header: name length u16, value length i32 (-1: None), name, value

all big-endian. The reader takes plain records as they are, whoever wrote them.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Callable, Sequence
from typing import Any

from kasper_py.exceptions import SerdeError
from kasper_py.kafka.partitioner import murmur2_partition
from kasper_py.message import Headers, Message, OutgoingMessage, OutgoingRecord
from kasper_py.sender import Sender, SendRecord
from kasper_py.serdes import bound_to

__all__ = ["FRAME_CAP", "PACKED", "Expander", "Packer", "frames", "unpack", "unpacked"]

PACKED = "kasper.packed"
"""The header that marks a packed record and holds its frame."""
VERSION = 1
FRAME_CAP = 256 * 1024
"""Bytes a frame holds at most (a record larger alone gets a frame of its own): a
quarter of Kafka's default ``max.message.bytes`` (1 MiB), so a frame never nears it."""
_HEAD = struct.Struct(">BI")
_RECORD = struct.Struct(">qiiH")
_HEADER = struct.Struct(">Hi")
_HEADERS = operator.itemgetter(6)
"""A ``Message``'s headers."""
_KEYS_CACHED = 100_000
"""Keys whose partition a ``Packer`` remembers (murmur2 in Python costs ~7 µs a key);
past this many the memory starts afresh."""

Inner = tuple["bytes | None", "bytes | None", int, "list[tuple[str, bytes | None]] | None"]
"""A record in a frame: key bytes, value bytes, timestamp (0: the outer's), headers."""


def frames(records: Sequence[Inner], cap: int = FRAME_CAP) -> list[bytes]:
    """``records`` as frames of at most ``cap`` bytes each (one record larger than
    ``cap`` gets a frame alone), in order; none for no records."""
    found: list[bytes] = []
    parts: list[bytes] = []
    size = count = 0
    for key, value, timestamp, headers in records:
        part = _RECORD.pack(timestamp, -1 if key is None else len(key),
                            -1 if value is None else len(value),
                            len(headers) if headers else 0)
        part += (key or b"") + (value or b"")
        if headers:
            part += _headers(headers)
        if count and size + len(part) > cap:
            found.append(_HEAD.pack(VERSION, count) + b"".join(parts))
            parts, size, count = [], 0, 0
        parts.append(part)
        size += len(part)
        count += 1
    if count:
        found.append(_HEAD.pack(VERSION, count) + b"".join(parts))
    return found


def _headers(headers: Sequence[tuple[str, bytes | None]]) -> bytes:
    parts = []
    for name, value in headers:
        encoded = name.encode()
        parts.append(_HEADER.pack(len(encoded), -1 if value is None else len(value))
                     + encoded + (value or b""))
    return b"".join(parts)


def unpack(frame: bytes) -> list[tuple[bytes | None, bytes | None, int, Headers]]:
    """The records of ``frame``, in order; ``ValueError`` saying what is wrong with a
    frame that is not one (unknown version, truncated, trailing bytes)."""
    if len(frame) < _HEAD.size:
        raise ValueError(f"a frame of {len(frame)} bytes is shorter than its head")
    version, count = _HEAD.unpack_from(frame)
    if version != VERSION:
        raise ValueError(f"frame version {version} is unknown (this kasper_py reads "
                         f"version {VERSION}): written by a newer kasper_py?")
    records = []
    at, end = _HEAD.size, len(frame)
    try:
        for _ in range(count):
            timestamp, key_size, value_size, header_count = _RECORD.unpack_from(frame, at)
            at += _RECORD.size
            key, at = _bytes(frame, at, key_size)
            value, at = _bytes(frame, at, value_size)
            headers: Headers = ()
            if header_count:
                headers, at = _read_headers(frame, at, header_count)
            records.append((key, value, timestamp, headers))
    except struct.error:
        raise ValueError(f"the frame ends inside record {len(records)} of {count}") from None
    if at != end:
        raise ValueError(f"the frame holds {end - at} bytes after its {count} records"
                         if at < end else
                         f"the frame ends inside record {len(records)} of {count}")
    return records


def unpacked(messages: Sequence[OutgoingMessage]) -> list[OutgoingMessage]:
    """``messages`` (what a ``ProcessorDriver`` sent, say) with each packed one replaced
    by the messages it holds, as they would have been sent plain (partitioned by key;
    a timestamp of 0 inherits the packed record's)."""
    found: list[OutgoingMessage] = []
    for message in messages:
        headers = message.headers
        if not headers or headers[0][0] != PACKED:
            found.append(message)
            continue
        found += [OutgoingMessage(message.topic, value, key, None, inner or None,
                                  timestamp or message.timestamp)
                  for key, value, timestamp, inner in unpack(headers[0][1] or b"")]
    return found


def _bytes(frame: bytes, at: int, size: int) -> tuple[bytes | None, int]:
    if size < 0:
        return None, at
    if at + size > len(frame):
        raise struct.error("truncated")
    return frame[at:at + size], at + size


def _read_headers(frame: bytes, at: int, count: int) -> tuple[Headers, int]:
    headers = []
    for _ in range(count):
        name_size, value_size = _HEADER.unpack_from(frame, at)
        at += _HEADER.size
        name, at = _bytes(frame, at, name_size)
        value, at = _bytes(frame, at, value_size)
        headers.append(((name or b"").decode(errors="replace"), value))
    return tuple(headers), at


class Packer:
    """Packs what a stage sends to a repartition (``Sender.repartition_many``'s
    encoded records) into one record per destination partition: each key goes to the
    partition the producer would have put it on (murmur2 of its bytes, as the
    producer's ``murmur2_random`` partitioner), so partitioning is unchanged."""

    __slots__ = ("_cap", "_partitions")

    def __init__(self, cap: int = FRAME_CAP) -> None:
        self._cap = cap
        self._partitions: dict[bytes, int] = {}

    def send(self, sender: Sender, name: str, records: Sequence[SendRecord]) -> None:
        """``records`` to repartition ``name``, packed (``Sender.repartition_packed``)."""
        sender.repartition_packed(name, records, self.pack)

    def pack(self, encoded: list[OutgoingRecord], partitions: int) -> list[OutgoingRecord]:
        """``encoded`` (records for one topic, partitioned by key) as packed records."""
        by_partition: dict[int, list[Inner]] = {}
        newest: dict[int, int] = {}
        known = self._partitions
        if len(known) > _KEYS_CACHED:
            known.clear()
        for record in encoded:
            key = record[2]
            partition = known.get(key)
            if partition is None:
                partition = known[key] = murmur2_partition(key, partitions)
            timestamp = record[6]
            by_partition.setdefault(partition, []).append(
                (key, record[1], timestamp, record[7] if len(record) > 7 else None))
            if timestamp > newest.get(partition, 0):
                newest[partition] = timestamp
        topic = encoded[0][0]
        return [(topic, None, None, partition, None, None, newest.get(partition, 0),
                 [(PACKED, frame)])
                for partition, records in by_partition.items()
                for frame in frames(records, self._cap)]


class Expander:
    """Expands the packed records of the repartition topics a stage reads into the
    ``Message``s they hold, decoded with the config's serdes, in order; each inner
    message keeps its outer record's topic, partition and offset."""

    __slots__ = ("_decoders", "_key_serde", "_topics", "_value_serde")

    def __init__(self, topics: frozenset[str], key_serde: Any, value_serde: Any) -> None:
        self._topics, self._key_serde, self._value_serde = topics, key_serde, value_serde
        self._decoders: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {}

    def expand(self, messages: list[Message]) -> list[Message]:
        """``messages`` with each packed one replaced by its records (the same list
        when none is packed)."""
        if not any(h and h[0][0] == PACKED for h in map(_HEADERS, messages)):
            return messages
        out: list[Message] = []
        for message in messages:
            headers = message.headers
            if headers and headers[0][0] == PACKED and message.topic in self._topics:
                out += self._inner(message, headers[0][1])
            else:
                out.append(message)
        return out

    def _inner(self, message: Message, frame: bytes | None) -> list[Message]:
        topic, partition, offset = message.topic, message.partition, message.offset
        try:
            records = unpack(frame or b"")
        except ValueError as exc:
            raise SerdeError(f"cannot unpack the packed record {topic}[{partition}] offset "
                             f"{offset}: {exc}; the turn is not committed") from exc
        decode_key, decode_value = self._decoders_of(topic)
        outer_time, kind, new = message.timestamp, message.timestamp_type, tuple.__new__
        try:
            return [new(Message, (topic, partition, offset, decode_key(key),
                                  decode_value(value), timestamp or outer_time, headers,
                                  kind))
                    for key, value, timestamp, headers in records]
        except SerdeError as exc:
            raise SerdeError(f"cannot decode a record packed in {topic}[{partition}] offset "
                             f"{offset}: {exc}; the turn is not committed") from exc

    def _decoders_of(self, topic: str) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
        found = self._decoders.get(topic)
        if found is None:
            found = self._decoders[topic] = (bound_to(self._key_serde, topic).decode,
                                             bound_to(self._value_serde, topic).decode)
        return found


