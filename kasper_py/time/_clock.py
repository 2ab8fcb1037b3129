"""A partition's clock: its stream time and the timers its processor scheduled
(``ProcessorContext.schedule``). The turn engine keeps one per partition and fires
the timers (``keeper.py``); nothing here runs a callback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from kasper_py.time._extractor import TimestampExtractor, event_time

if TYPE_CHECKING:
    from kasper_py.message import Message
    from kasper_py.sender import Sender

__all__ = ["PartitionClock", "Timer", "TimerCallback", "TimerKind", "interval_ms", "next_due"]

TimerKind = Literal["stream_time", "wall_clock"]
TimerCallback = Callable[[int, "Sender"], None]
"""``callback(timestamp_ms, sender)``: the stream or wall-clock time that fired it, and
the turn's ``Sender``."""
_KINDS = ("stream_time", "wall_clock")


class Timer:
    """What ``ProcessorContext.schedule`` returns: a timer, due at ``due`` (milliseconds:
    of stream time or of the wall clock, by ``kind``), until ``cancel()``."""

    __slots__ = ("_cancelled", "callback", "due", "interval_ms", "kind")

    def __init__(self, kind: TimerKind, interval: int, callback: TimerCallback,
                 due: int | None) -> None:
        self.kind = kind
        self.interval_ms = interval
        self.callback = callback
        self.due = due
        """When it fires next; ``None``: never (a wall-clock timer where no wall clock
        runs, as in the Spark reprocess task)."""
        self._cancelled = False

    def cancel(self) -> None:
        """Stop the timer: it never fires again (from inside its own callback too)."""
        self._cancelled = True

    @property
    def cancelled(self) -> bool:
        """True once ``cancel()`` was called."""
        return self._cancelled

    def __repr__(self) -> str:
        state = " cancelled" if self._cancelled else f" due={self.due}"
        return f"<Timer {self.kind} every {self.interval_ms} ms{state}>"


def interval_ms(seconds: float, what: str) -> int:
    """``seconds`` as whole milliseconds, at least one; ``ValueError`` naming ``what``."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
        raise ValueError(f"{what} must be a positive number of seconds, got {seconds!r}")
    millis = round(seconds * 1000)
    if millis < 1:
        raise ValueError(f"{what} must be at least 0.001 seconds, got {seconds!r}")
    return millis


def next_due(due: int, interval: int, now: int) -> int:
    """The due time after one that fired at ``now``: one interval on, or, when ``now``
    is already past that, the first of ``due + k * interval`` after ``now`` (missed runs
    are skipped, not caught up: Kafka Streams' punctuation schedule)."""
    following = due + interval
    if now >= following:
        following = due + ((now - due) // interval + 1) * interval
    return following


class PartitionClock:
    """One partition's stream time and timers; reached through ``ProcessorContext``."""

    def __init__(self, partition: int, extractor: TimestampExtractor | None = None,
                 wall_clock: Callable[[], float] | None = None) -> None:
        self.partition = partition
        self.extractor = extractor
        self.stream_time: int | None = None
        """The largest event time of the partition's records processed so far (the batch
        in hand included); ``None`` until a record (or ``observe``) sets it."""
        self.timers: list[Timer] = []
        self._wall_clock = wall_clock

    def event_time(self, message: Message) -> int | None:
        """``message``'s event time: the extractor's value, else its Kafka timestamp."""
        return event_time(message, self.extractor)

    def observe(self, millis: int) -> None:
        """Raise the stream time to ``millis`` if that is later; it never goes back."""
        if isinstance(millis, bool) or not isinstance(millis, int) or millis < 0:
            raise ValueError(f"stream time must be an int of milliseconds >= 0, got {millis!r}")
        if self.stream_time is None or millis > self.stream_time:
            self.stream_time = millis

    def schedule(self, interval: float, callback: TimerCallback,
                 kind: TimerKind = "stream_time") -> Timer:
        """A timer calling ``callback(timestamp_ms, sender)`` every ``interval`` seconds of
        ``kind`` time (see ``ProcessorContext.schedule``)."""
        millis = interval_ms(interval, "schedule() interval")
        if not callable(callback):
            raise TypeError(f"schedule() callback must be callable, got {callback!r}")
        if kind not in _KINDS:
            raise ValueError(f"schedule() kind must be 'stream_time' or 'wall_clock', "
                             f"got {kind!r}")
        if kind == "stream_time":
            due: int | None = 0  # aligned to the epoch: fires at the first record
        else:
            due = None if self._wall_clock is None else int(self._wall_clock() * 1000) + millis
        timer = Timer(kind, millis, callback, due)
        self.timers.append(timer)
        return timer
