"""``Ttl``: how long a table keeps a key after its last write, by which time, and how
many expired keys one turn removes at most. The tables that take it (rocksdb.py,
memory.py) keep their own time index and ask ``Ttl.clock`` for the time they date
writes with and expire by; Redis and Cassandra hand expiry to the server.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

__all__ = ["DATE_HEADER", "Clock", "EventTime", "ExpiryClock", "StreamTime", "Ttl", "TtlBy",
           "WriteTime", "changelog_date", "now_ms"]

Clock = Callable[[], float]
"""Seconds since the epoch: ``time.time``, or a test driver's wall clock."""

StreamTime = Callable[[], "int | None"]
"""The partition's stream time in milliseconds, ``None`` before its first record."""

TtlBy = Literal["write", "event"]
"""What a key's expiry counts from: ``"write"``, the wall clock of the turn that last
wrote it; ``"event"``, the partition's stream time at that turn."""

_SWEEP_LIMIT = 10_000

DATE_HEADER = "kasper.date"
"""The header (ASCII milliseconds) of a table's changelog record whose date its timestamp
cannot carry: a date of 0 (a stream time of 0, or an event-time table's write before any
record), since a Kafka producer reads timestamp 0 as "now" and stamps its wall clock."""


@dataclass(frozen=True)
class Ttl:
    """A key expires ``seconds`` after its last write (the wall clock of the turn that
    wrote it); each turn removes at most ``sweep_limit`` expired keys, oldest first,
    so a turn's cost stays bounded however many keys expire at once."""

    seconds: float
    sweep_limit: int = _SWEEP_LIMIT
    by: TtlBy = "write"
    """``"event"``: a key expires once the partition's stream time is ``seconds`` past
    the stream time of the turn that last wrote it (see ``EventTime``)."""

    def __post_init__(self) -> None:
        if isinstance(self.seconds, bool) or not self.seconds > 0:
            raise ValueError(f"ttl must be a positive number of seconds, got {self.seconds!r}")
        if self.sweep_limit < 1:
            raise ValueError(f"ttl sweep_limit must be at least 1, got {self.sweep_limit!r}")
        if self.by not in ("write", "event"):
            raise ValueError(f"ttl by must be 'write' or 'event', got {self.by!r}")

    @property
    def ms(self) -> int:
        """``seconds`` in whole milliseconds (at least one)."""
        return max(1, round(self.seconds * 1000))

    @classmethod
    def of(cls, ttl: float | Ttl | None) -> Ttl | None:
        """``ttl`` as a ``Ttl``: seconds take the default sweep limit; ``None`` is none."""
        if ttl is None or isinstance(ttl, Ttl):
            return ttl
        return cls(ttl)

    @classmethod
    def by_server(cls, ttl: float | Ttl | None, store: str) -> Ttl | None:
        """``of(ttl)`` for a store whose server expires keys on its own wall clock (Redis,
        Cassandra): ``by="event"`` is refused there, naming the store."""
        made = cls.of(ttl)
        if made is not None and made.by == "event":
            raise ValueError(f"{store} expires keys on the server's clock: ttl by='event' "
                             "takes a RocksDBTable or a MemoryTable")
        return made

    def clock(self, wall_clock: Clock, stream_time: StreamTime) -> ExpiryClock:
        """The time a table dates its writes with and expires keys by, chosen once."""
        return EventTime(stream_time) if self.by == "event" else WriteTime(wall_clock)


class ExpiryClock(Protocol):
    """Milliseconds a table with a ttl dates a turn's writes with (the changelog
    records' timestamp) and compares expiries to."""

    def now(self) -> int:
        """The time, in milliseconds."""

    def seen(self, millis: int) -> None:
        """A restore read writes dated ``millis``."""


class WriteTime:
    """The wall clock (``Ttl(by="write")``, the default)."""

    def __init__(self, wall_clock: Clock) -> None:
        self._wall_clock = wall_clock

    def now(self) -> int:
        """The wall clock, in milliseconds."""
        return now_ms(self._wall_clock)

    def seen(self, millis: int) -> None:
        """Nothing: the wall clock does not depend on what was written."""


class EventTime:
    """The partition's stream time (``Ttl(by="event")``): the newest record timestamp
    (or extracted event time) processed on the partition, the turn's batch included.
    Before the partition has one (after a start, until its first record) it is the
    newest time the table's own writes were dated with (restored ones included), and 0
    for a table that never had a write."""

    def __init__(self, stream_time: StreamTime) -> None:
        self._stream_time = stream_time
        self._latest = 0

    def now(self) -> int:
        """The stream time, never earlier than a time already given or seen."""
        current = self._stream_time()
        if current is not None and current > self._latest:
            self._latest = current
        return self._latest

    def seen(self, millis: int) -> None:
        """Raise the time to ``millis`` when that is later."""
        self._latest = max(self._latest, millis)


def now_ms(clock: Clock = time.time) -> int:
    """``clock()`` in whole milliseconds."""
    return int(clock() * 1000)


def changelog_date(record: Any) -> int:
    """The date a table's changelog record (confluent-kafka's accessors) was written
    with: its ``DATE_HEADER`` when it has one, else its timestamp."""
    for name, value in record.headers() or ():
        if name == DATE_HEADER and value is not None:
            return int(value)
    return int(record.timestamp()[1])
