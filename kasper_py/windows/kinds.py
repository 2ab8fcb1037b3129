"""The four kinds of window, each with a grace period: ``Tumbling``, ``Hopping``,
``Sliding`` and ``Session``. Durations are given in seconds (a number or a
``timedelta``) and kept in milliseconds, the unit of event timestamps. Which windows a
record falls in is here; what a table does with them is in table.py.

Every window holds the records with ``start <= timestamp < end`` (``end`` exclusive).
A window closes once stream time (the largest event time seen) reaches
``end + grace``: later records for it are late and dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import timedelta

__all__ = ["Hopping", "JoinWindows", "Session", "Sliding", "Tumbling", "WindowKind", "to_millis"]

Duration = float | int | timedelta
"""Seconds, or a ``timedelta``."""


def to_millis(what: str, duration: Duration, *, positive: bool) -> int:
    """``duration`` in whole milliseconds; a ``ValueError`` naming ``what`` when it is not
    a number of seconds, is negative, or (``positive``) is under one millisecond."""
    if isinstance(duration, timedelta):
        seconds = duration.total_seconds()
    elif isinstance(duration, int | float) and not isinstance(duration, bool):
        seconds = float(duration)
    else:
        raise ValueError(f"{what} must be seconds (a number or a timedelta), "
                         f"got {duration!r}")
    millis = round(seconds * 1000) if math.isfinite(seconds) else -1
    if positive and millis <= 0:
        raise ValueError(f"{what} must be more than 0 s (at least 1 ms), got {duration!r}")
    if millis < 0:
        raise ValueError(f"{what} must be a finite number of seconds >= 0, got {duration!r}")
    return millis


@dataclass(frozen=True)
class WindowKind:
    """What every kind has: a grace period, in milliseconds as ``grace_ms``."""

    grace: Duration = field(default=0, kw_only=True)
    """How long after a window's end its late records are still taken (seconds)."""
    grace_ms: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "grace_ms", to_millis("grace", self.grace, positive=False))

    def _set(self, name: str, millis: int) -> None:
        object.__setattr__(self, name, millis)


@dataclass(frozen=True)
class Tumbling(WindowKind):
    """Fixed-size, non-overlapping windows aligned to the epoch: ``[k*size, (k+1)*size)``.

    ``Tumbling(60, grace=10)``: one window a minute, late records taken for 10 s.
    """

    size: Duration
    size_ms: int = field(init=False, repr=False, compare=False)


    def __post_init__(self) -> None:
        super().__post_init__()
        self._set("size_ms", to_millis("tumbling window size", self.size, positive=True))

    def starts(self, timestamp: int) -> range:
        """The start of the one window holding ``timestamp``, as a range."""
        start = timestamp - timestamp % self.size_ms
        return range(start, start + 1)


@dataclass(frozen=True)
class Hopping(WindowKind):
    """Fixed-size windows that start every ``advance``: ``[k*advance, k*advance+size)``,
    so a record falls in ``size / advance`` of them. Windows that would start before
    the epoch are left out, as in Kafka Streams.

    ``Hopping(300, advance=60)``: five-minute windows, a new one every minute.
    """

    size: Duration
    advance: Duration
    size_ms: int = field(init=False, repr=False, compare=False)
    advance_ms: int = field(init=False, repr=False, compare=False)


    def __post_init__(self) -> None:
        super().__post_init__()
        size = to_millis("hopping window size", self.size, positive=True)
        advance = to_millis("hopping window advance", self.advance, positive=True)
        if advance > size:
            raise ValueError(f"hopping window advance ({self.advance!r} s) must not exceed "
                             f"its size ({self.size!r} s): records between windows would "
                             "fall in none")
        self._set("size_ms", size)
        self._set("advance_ms", advance)

    def starts(self, timestamp: int) -> range:
        """The starts of every window holding ``timestamp``, earliest first."""
        advance = self.advance_ms
        first = max((timestamp - self.size_ms) // advance + 1, 0) * advance
        return range(first, timestamp + 1, advance)


@dataclass(frozen=True)
class Sliding(WindowKind):
    """Kafka Streams' sliding windows: fixed-size windows defined by the records
    themselves. Two records share a window when their timestamps differ by at most
    ``difference``. A window is created each time a record enters one (the window
    ``[t - difference, t]`` ending at the record) or leaves one (the window starting
    just after it, ``[t + 1, t + 1 + difference]``, when records fall in it); so every
    distinct set of records within ``difference`` of each other gets one aggregate.

    A record whose own window ``[t - difference, t]`` has closed is late and dropped.
    """

    difference: Duration
    difference_ms: int = field(init=False, repr=False, compare=False)


    def __post_init__(self) -> None:
        super().__post_init__()
        self._set("difference_ms", to_millis("sliding window time difference",
                                             self.difference, positive=True))


@dataclass(frozen=True)
class Session(WindowKind):
    """Sessions of activity per key: records at most ``gap`` apart share a session, and
    a record that bridges two sessions merges them. A session ``[first, last]`` closes
    once stream time reaches ``last + gap + grace`` (it can no longer grow then).

    A record is late, and dropped, when a session of its own would already be closed
    (stream time reached ``timestamp + gap + grace``) or when it would join a closed one.
    """

    gap: Duration
    gap_ms: int = field(init=False, repr=False, compare=False)


    def __post_init__(self) -> None:
        super().__post_init__()
        self._set("gap_ms", to_millis("session inactivity gap", self.gap, positive=True))


@dataclass(frozen=True)
class JoinWindows(WindowKind):
    """How close in event time two records of a windowed stream-stream join must be
    (Kafka Streams' ``JoinWindows``): a left record at ``t`` joins the right records
    from ``t - before`` to ``t + after``, both ``within`` unless given. A record is late
    once stream time passes the end of its window plus ``grace``.

    ``JoinWindows(5, grace=1)``: records at most 5 s apart, either way.
    ``JoinWindows(0, after=60)``: right records in the minute after the left one.
    """

    within: Duration
    before: Duration | None = field(default=None, kw_only=True)
    after: Duration | None = field(default=None, kw_only=True)
    before_ms: int = field(init=False, repr=False, compare=False)
    after_ms: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        before = self.within if self.before is None else self.before
        after = self.within if self.after is None else self.after
        self._set("before_ms", to_millis("join window before", before, positive=False))
        self._set("after_ms", to_millis("join window after", after, positive=False))
