"""Input that does not decode, under ``Config.on_decode_error``: the error that names
it, the record kept with its original bytes when the policy sets it aside, and how
it is logged and sent to the dead-letter topic. The live loop and the Spark task both
come here, so bad input is treated alike by the two.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import structlog

from kasper_py.exceptions import SerdeError
from kasper_py.message import Headers
from kasper_py.sender import Sender

if TYPE_CHECKING:
    from kasper_py.config import Config

__all__ = ["Undecodable", "dead_letter_headers", "send_aside", "undecodable_error"]

_log = structlog.get_logger("kasper_py")


class Undecodable(NamedTuple):
    """An input record whose key or value did not decode, as it was read (bytes)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int | None
    headers: Headers
    timestamp_type: int
    error: str
    """What the serde said, e.g. ``json serde: invalid JSON: ...``."""


def undecodable_error(topic: str, partition: int, offset: int, exc: SerdeError) -> SerdeError:
    """The error the ``fail`` policy raises: the serde's, with the record's coordinates."""
    return SerdeError(f"cannot decode {topic}[{partition}] offset {offset}: {exc} "
                      "(on_decode_error='fail'; 'skip' or 'dead_letter' would set it aside)")


def dead_letter_headers(record: Undecodable, processor: str) -> list[tuple[str, bytes | None]]:
    """The record's own headers, then where it came from and why it was set aside."""
    headers: list[tuple[str, bytes | None]] = list(record.headers)
    headers += [
        ("kasper.error", record.error.encode()),
        ("kasper.error.type", b"SerdeError"),
        ("kasper.processor", processor.encode()),
        ("kasper.source.topic", record.topic.encode()),
        ("kasper.source.partition", str(record.partition).encode()),
        ("kasper.source.offset", str(record.offset).encode()),
    ]
    if record.timestamp is not None:
        headers.append(("kasper.source.timestamp", str(record.timestamp).encode()))
    return headers


def send_aside(records: Sequence[Undecodable], config: Config, sender: Sender) -> None:
    """Log every set-aside record and, with a dead-letter topic, buffer its original key,
    value and headers for that topic, so it is produced and acked before the commit."""
    topic = config.dead_letter_topic
    for record in records:
        _log.warning("kasper.undecodable", processor=config.name, topic=record.topic,
                     partition=record.partition, offset=record.offset, error=record.error,
                     policy=config.on_decode_error, dead_letter_topic=topic)
        if topic is not None:
            sender.send(topic, record.value, record.key,
                        headers=dead_letter_headers(record, config.name))
