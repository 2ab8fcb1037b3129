"""``Message``: one input record as a processor sees it, and ``OutgoingMessage``,
one record a processor asked to send. Both are immutable tuples, cheap to build
in the hot path.
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["TIMESTAMP_CREATE_TIME", "TIMESTAMP_LOG_APPEND_TIME", "TIMESTAMP_NONE", "Headers",
           "Message", "OutgoingMessage", "OutgoingRecord"]

Headers = tuple[tuple[str, bytes | None], ...]

TIMESTAMP_NONE = 0
"""``Message.timestamp_type``: the record has no timestamp (``timestamp`` is ``None``)."""
TIMESTAMP_CREATE_TIME = 1
"""``Message.timestamp_type``: the producer set the timestamp (the topic's default)."""
TIMESTAMP_LOG_APPEND_TIME = 2
"""``Message.timestamp_type``: the broker set it on append
(``message.timestamp.type=LogAppendTime`` on the topic)."""


class Message(NamedTuple):
    """An input record: its coordinates, decoded key and value, timestamp and headers."""

    topic: str
    partition: int
    offset: int
    key: Any
    """Decoded by ``Config.key_serde`` (bytes by default); ``None`` when absent."""
    value: Any
    """Decoded by ``Config.value_serde`` (bytes by default); ``None`` for a tombstone."""
    timestamp: int | None = None
    """Milliseconds since the epoch, as Kafka recorded it, or ``None``."""
    headers: Headers = ()
    timestamp_type: int = TIMESTAMP_NONE
    """Who set ``timestamp``: ``TIMESTAMP_CREATE_TIME`` (the producer),
    ``TIMESTAMP_LOG_APPEND_TIME`` (the broker) or ``TIMESTAMP_NONE`` (no timestamp); the
    values are confluent-kafka's."""


class OutgoingMessage(NamedTuple):
    """A record buffered by ``Sender.send``, already encoded to bytes."""

    topic: str
    value: bytes | None
    key: bytes | None = None
    partition: int | None = None
    """``None`` lets the producer's partitioner (murmur2 of the key) choose."""
    headers: Headers | None = None
    timestamp: int | None = None
    """Milliseconds since the epoch the record is produced with (its create time);
    ``None`` leaves it to the producer (the time it is produced)."""


OutgoingRecord = tuple[str, bytes | None, bytes | None, int | None, Headers | None, int | None]
"""What a ``Sender`` hands to the producer: the fields of an ``OutgoingMessage`` as a
plain tuple, in the same order (an ``OutgoingMessage`` is one too). A plain tuple costs
a third of a named one to build, and the producer only unpacks it."""
