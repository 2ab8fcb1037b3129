"""Event time: ``Config.timestamp_extractor`` resolved to a function, and the event
time of one message or of a partition's batch (the extractor's value, else the Kafka
timestamp). Nothing here keeps time; ``_clock.py`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import TYPE_CHECKING

from kasper_py._support.names import NameResolutionError, resolve_name
from kasper_py.exceptions import ConfigError

if TYPE_CHECKING:
    from kasper_py.message import Message

__all__ = ["EventTimeError", "TimestampExtractor", "event_time", "extractor_for", "newest"]

TimestampExtractor = Callable[["Message"], "int | None"]
"""A message's event time in milliseconds since the epoch, or ``None`` for "use its
Kafka timestamp"."""

_FIELD = "timestamp_extractor"
_kafka_timestamp = itemgetter(5)  # Message.timestamp, read in C


class EventTimeError(ValueError):
    """The extractor returned something that is not milliseconds since the epoch."""


def extractor_for(spec: str | TimestampExtractor | None) -> TimestampExtractor | None:
    """``Config.timestamp_extractor`` as a function (a ``module:function`` name, which
    the Config checked the shape of, is imported here, in the process that runs the
    turns); ``None`` when there is none. Raises ``ConfigError`` naming the field when the
    name does not import or is not callable."""
    if spec is None or callable(spec):
        return spec
    try:
        target = resolve_name(spec)
    except NameResolutionError as exc:
        raise ConfigError(_FIELD, f"{spec!r}: {exc} (it must be importable where the "
                          "processor runs)") from None
    if not callable(target):
        raise ConfigError(_FIELD, f"{spec!r} is a {type(target).__name__}, not a function "
                          "of a Message")
    return target  # type: ignore[no-any-return]  # called with a Message; results checked


def event_time(message: Message, extractor: TimestampExtractor | None) -> int | None:
    """The extractor's value for ``message``, else (none, or it returned ``None``) the
    Kafka timestamp. Raises ``EventTimeError`` for a value that is not an int >= 0."""
    if extractor is not None:
        value = extractor(message)
        if value is not None:
            if type(value) is not int or value < 0:
                raise EventTimeError(f"timestamp_extractor returned {value!r} for "
                                     f"{message.topic}[{message.partition}] offset "
                                     f"{message.offset}: it must return milliseconds since "
                                     "the epoch (an int >= 0) or None")
            return value
    return message.timestamp


def newest(messages: Sequence[Message], extractor: TimestampExtractor | None) -> int | None:
    """The newest event time among ``messages`` (``None`` when none has one). Without an
    extractor this is a ``max`` over the timestamps, in C: cheap on the hot path."""
    if extractor is None:
        newest_timestamp = getattr(messages, "newest_timestamp", None)
        if newest_timestamp is not None:  # a columnar batch (TableBatch): its column's max
            return newest_timestamp()  # type: ignore[no-any-return]
        try:
            return max(map(_kafka_timestamp, messages), default=None)
        except TypeError:  # some messages have no timestamp
            return max((m.timestamp for m in messages if m.timestamp is not None), default=None)
    times = [event_time(m, extractor) for m in messages]
    return max((t for t in times if t is not None), default=None)
