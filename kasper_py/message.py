"""``Message``: one input record as a processor sees it, and ``OutgoingMessage``,
one record a processor asked to send. Both are immutable tuples, cheap to build
in the hot path.
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["Headers", "Message", "OutgoingMessage", "OutgoingRecord"]

Headers = tuple[tuple[str, bytes | None], ...]


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


class OutgoingMessage(NamedTuple):
    """A record buffered by ``Sender.send``, already encoded to bytes."""

    topic: str
    value: bytes | None
    key: bytes | None = None
    partition: int | None = None
    """``None`` lets the producer's partitioner (murmur2 of the key) choose."""
    headers: Headers | None = None


OutgoingRecord = tuple[str, bytes | None, bytes | None, int | None, Headers | None]
"""What a ``Sender`` hands to the producer: the fields of an ``OutgoingMessage`` as a
plain tuple, in the same order (an ``OutgoingMessage`` is one too). A plain tuple costs
a third of a named one to build, and the producer only unpacks it."""
