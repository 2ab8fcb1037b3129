"""Positions in the input topics and their resolution to offsets, one way for every
command: ``"earliest"``, ``"latest"``, a time (ISO-8601, UTC without a zone, or epoch
milliseconds) or explicit next offsets per topic-partition. ``parse_position`` reads
the text forms; ``resolve_position`` turns a position into an offset per partition
from the watermarks and an offsets-for-a-time lookup (``KafkaAdmin.offsets_at``).
Checking a resolved offset against its watermarks stays with each caller, whose
messages name its own flags.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Literal

from kasper_py.message import TopicPartitionKey

__all__ = ["OffsetsAtTime", "Position", "parse_offset", "parse_position",
           "resolve_position", "to_millis"]

Position = Literal["earliest", "latest"] | datetime | Mapping[TopicPartitionKey, int]
"""Where a range starts or ends: ``"earliest"``, ``"latest"``, a ``datetime`` (the first
offset whose timestamp is at or after it; naive means UTC), or explicit next offsets per
``(topic, partition)``."""

OffsetsAtTime = Callable[[int], Mapping[TopicPartitionKey, int]]
"""Given epoch milliseconds, the first offset at or after that time per partition
(the high watermark where no message is that recent)."""

_FORMS = "earliest, latest, an ISO-8601 time or epoch milliseconds"


def to_millis(moment: datetime) -> int:
    """Epoch milliseconds of ``moment``; a naive datetime is taken as UTC."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def parse_position(text: str, *, offsets: bool = True) -> Position:
    """``earliest``, ``latest``, epoch milliseconds, an ISO-8601 time (UTC without a
    zone) or, with ``offsets``, ``topic:partition=offset[,...]``. A time comes back as an
    aware ``datetime``. Raises ``ValueError`` naming the accepted forms."""
    text = text.strip()
    if text == "earliest":
        return "earliest"
    if text == "latest":
        return "latest"
    if text.isdigit():
        return datetime.fromtimestamp(int(text) / 1000, tz=UTC)
    if offsets and "=" in text:
        found = (parse_offset(item) for item in text.split(",") if item.strip())
        return {(topic, partition): offset for topic, partition, offset in found}
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        more = " or topic:partition=offset[,...]" if offsets else ""
        raise ValueError(f"{text!r} is not {_FORMS}{more}") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def parse_offset(text: str) -> tuple[str, int, int]:
    """``TOPIC:PARTITION=OFFSET`` as ``(topic, partition, offset)``; Kafka topic names
    hold neither ``:`` nor ``=``. Raises ``ValueError`` showing the form."""
    place, _, offset = text.strip().rpartition("=")
    topic, _, partition = place.rpartition(":")
    if not topic or not partition.isdigit() or not offset.strip().isdigit():
        raise ValueError(f"{text.strip()!r} is not TOPIC:PARTITION=OFFSET "
                         "(e.g. orders:3=1234)")
    return topic, int(partition), int(offset)


def resolve_position(position: Position, keys: Sequence[TopicPartitionKey],
                     watermarks: Mapping[TopicPartitionKey, tuple[int, int]],
                     offsets_at: OffsetsAtTime, *,
                     unnamed: Literal["low", "high"] | None = None
                     ) -> dict[TopicPartitionKey, int]:
    """The offset of ``position`` in each of ``keys``: the low watermark for
    ``earliest``, the high one for ``latest``, ``offsets_at`` for a time, the given
    offset for explicit offsets. A partition explicit offsets leave out takes the
    ``unnamed`` watermark, or is left out of the answer when ``unnamed`` is ``None``.
    Raises ``ValueError`` for anything that is not a position."""
    if position == "earliest":
        return {key: watermarks[key][0] for key in keys}
    if position == "latest":
        return {key: watermarks[key][1] for key in keys}
    if isinstance(position, datetime):
        found = offsets_at(to_millis(position))
        return {key: found[key] for key in keys}
    if isinstance(position, Mapping):
        if unnamed is None:
            return {key: position[key] for key in keys if key in position}
        edge = 0 if unnamed == "low" else 1
        return {key: position.get(key, watermarks[key][edge]) for key in keys}
    raise ValueError(f"{position!r} is not a position")
