"""``TimeKeeper``: the turn engine's time. It keeps every partition's clock, stamps
each partition's batch with its newest event time (moving stream time on), and fires,
inside the turn, what is due: wall-clock timers and tasks before the input is
processed, and a partition's stream-time timers right after its batch, when the batch
advanced its stream time. A failed turn puts every clock and schedule back as it was,
so what fired in it fires again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kasper_py.exceptions import KasperError, ProcessingError
from kasper_py.time._clock import PartitionClock, Timer, next_due
from kasper_py.time._extractor import extractor_for, newest
from kasper_py.time._tasks import NEVER, Task

if TYPE_CHECKING:
    from kasper_py.config import Config
    from kasper_py.message import Message
    from kasper_py.sender import Sender

__all__ = ["TimeKeeper"]

_LEAD_RETRY_MS = 500
"""How often a one-time leader-only task due where this process does not lead looks
again whether it leads."""


@dataclass
class _Scheduled:
    """A task and when it runs next (ms since the epoch)."""

    task: Task
    due: int


@dataclass
class _Saved:
    """Every clock and schedule as it was when a turn began."""

    stream_times: dict[int, int | None]
    timer_dues: list[tuple[Timer, int | None]]
    task_dues: list[tuple[_Scheduled, int]]


class TimeKeeper:
    """Stream time per partition, timers and tasks, for one ``TurnEngine``.

    ``wall_clock`` (seconds since the epoch) drives wall-clock timers and tasks; with
    ``None`` (the Spark reprocess task) neither ever runs.
    """

    def __init__(self, config: Config, wall_clock: Callable[[], float] | None,
                 tasks: Sequence[Task] = (), *,
                 leading: Callable[[], bool] | None = None) -> None:
        if any(not isinstance(task, Task) for task in tasks):
            raise TypeError(f"tasks must be Task objects, got {list(tasks)!r}")
        self.extractor = extractor_for(config.timestamp_extractor)
        self._wall_clock = wall_clock
        self._clocks: dict[int, PartitionClock] = {}
        self._advanced: set[int] = set()
        self._idle_ms = None if config.idle_advance is None else round(
            config.idle_advance * 1000)
        self._last_input: dict[int, tuple[int, int]] = {}
        """With ``idle_advance``: per partition, (wall clock, stream time) of its last
        batch of records."""
        now = self.now()
        self._tasks = [] if now is None else [_Scheduled(t, t.first_due(now)) for t in tasks]
        self.leader: Callable[[], bool] = leading or _always
        """Whether this process leads its app's processes now: a task ``on_leader`` runs
        only while it does (a run due elsewhere is skipped here, not caught up). Alone,
        a process always leads; the loop hands in its leader election's."""

    def now(self) -> int | None:
        """The wall clock in milliseconds since the epoch; ``None`` without one."""
        return None if self._wall_clock is None else int(self._wall_clock() * 1000)

    # -- partitions ---------------------------------------------------------------------

    def clock(self, partition: int) -> PartitionClock:
        """``partition``'s clock, made on first use."""
        clock = self._clocks.get(partition)
        if clock is None:
            clock = self._clocks[partition] = PartitionClock(partition, self.extractor,
                                                             self._wall_clock)
        return clock

    def forget(self, partition: int) -> None:
        """The partition left this process: drop its clock and timers."""
        self._clocks.pop(partition, None)
        self._advanced.discard(partition)
        self._last_input.pop(partition, None)

    def clear_timers(self, partition: int) -> None:
        """The partition's processor is rebuilt: its timers go with the old instance (the
        new one schedules its own); the stream time stays."""
        clock = self._clocks.get(partition)
        if clock is not None:
            for timer in clock.timers:
                timer.cancel()
            clock.timers = []

    # -- a turn -------------------------------------------------------------------------

    def save(self) -> _Saved:
        """Every clock and schedule now, for ``restore`` if the turn fails."""
        clocks = self._clocks.values()
        return _Saved({c.partition: c.stream_time for c in clocks},
                      [(t, t.due) for c in clocks for t in c.timers],
                      [(s, s.due) for s in self._tasks])

    def restore(self, saved: _Saved) -> None:
        """Back to ``saved``: the failed turn's stream time and firings never happened."""
        for partition, stream_time in saved.stream_times.items():
            if partition in self._clocks:
                self._clocks[partition].stream_time = stream_time
        for timer, due in saved.timer_dues:
            timer.due = due
        for scheduled, due in saved.task_dues:
            scheduled.due = due
        self._advanced.clear()

    def mark(self, partition: int) -> tuple[int | None, bool]:
        """``partition``'s stream time now, and whether it advanced in this turn, for
        ``rollback``: a retried part of a batch must not leave stream time moved."""
        return self.clock(partition).stream_time, partition in self._advanced

    def rollback(self, partition: int, mark: tuple[int | None, bool]) -> None:
        """``partition``'s stream time back to ``mark`` (see ``mark``)."""
        self.clock(partition).stream_time, advanced = mark
        if advanced:
            self._advanced.add(partition)
        else:
            self._advanced.discard(partition)

    def stamp(self, partition: int, messages: Sequence[Message]) -> int | None:
        """Move ``partition``'s stream time on to the newest event time of ``messages``
        (never back); return that newest event time, the output timestamp they give.
        Raises what the extractor raises, or ``EventTimeError`` for a bad value."""
        batch_time = newest(messages, self.extractor)
        if batch_time is not None:
            self.advance(partition, batch_time)
        if self._idle_ms is not None:  # only idle_advance reads when input last came
            now, stream_time = self.now(), self.clock(partition).stream_time
            if now is not None and stream_time is not None:
                self._last_input[partition] = (now, stream_time)
        return batch_time

    def advance(self, partition: int, millis: int) -> None:
        """Records (or the testing driver) moved ``partition``'s stream time to ``millis``
        if later; its stream-time timers are checked when the turn fires them."""
        clock = self._clocks.get(partition) or self.clock(partition)  # a lookup a batch
        if clock.stream_time is None or millis > clock.stream_time:
            clock.stream_time = millis
            self._advanced.add(partition)

    def fire_wall_clock(self, sender: Sender) -> None:
        """Run the wall-clock timers (partition by partition) and then the tasks due now,
        each stamping its output with the wall-clock time. The turn calls this before it
        processes its input: they fell due while the batch was read."""
        now = self.now()
        if now is None:
            return
        self._advance_idle(now)
        timed = [p for p, clock in self._clocks.items() if clock.timers]
        for partition in sorted(timed):
            self._fire_timers(self._clocks[partition], "wall_clock", now, sender)
        for scheduled in self._tasks:
            if scheduled.due <= now and (not scheduled.task.on_leader or self.leader()):
                _call(f"task {scheduled.task.name!r}", None, scheduled.task.fn, now, sender)
                scheduled.due = scheduled.task.next_due(scheduled.due, now)
            elif scheduled.due <= now and scheduled.task.once:
                scheduled.due = now + _LEAD_RETRY_MS  # a one-time task waits to lead
            elif scheduled.due <= now:  # another process leads: its run, not ours
                scheduled.due = scheduled.task.next_due(scheduled.due, now)

    def _advance_idle(self, now: int) -> None:
        """``Config.idle_advance``: a partition whose last records came ``idle_advance``
        or more ago (wall clock) moves its stream time to the stream time it had then
        plus the wall-clock time since; its stream-time timers fire with the turn's."""
        idle = self._idle_ms
        if idle is None:
            return
        for partition, (at, stream_time) in self._last_input.items():
            if now - at >= idle and partition in self._clocks:
                self.advance(partition, stream_time + now - at)

    def _idle_dues(self) -> list[int]:
        """Wall-clock times at which an idle partition's stream time reaches its next
        stream-time timer (never before ``idle_advance`` has passed)."""
        if self._idle_ms is None:
            return []
        dues = []
        for partition, (at, stream_time) in self._last_input.items():
            clock = self._clocks.get(partition)
            timers = [] if clock is None else [t.due for t in clock.timers if t.kind ==
                                               "stream_time" and t.due is not None
                                               and not t.cancelled]
            if timers:
                dues.append(at + max(self._idle_ms, min(timers) - stream_time))
        return dues

    def fire_stream_time(self, sender: Sender, partition: int | None = None) -> None:
        """Run the stream-time timers due of ``partition`` (or of every partition) whose
        stream time advanced in this turn, each stamping its output with the stream
        time. The turn calls this right after a partition's batch is processed."""
        if not self._advanced:  # the common case: nothing moved, or fired already
            return
        advanced = [partition] if partition is not None else sorted(self._advanced)
        for number in advanced:
            if number not in self._advanced:
                continue
            self._advanced.discard(number)
            clock = self._clocks.get(number)
            if clock is not None and clock.timers and clock.stream_time is not None:
                self._fire_timers(clock, "stream_time", clock.stream_time, sender)

    def _fire_timers(self, clock: PartitionClock, kind: str, now: int, sender: Sender) -> None:
        clock.timers = [t for t in clock.timers if not t.cancelled]
        due = sorted((t for t in clock.timers if t.kind == kind and t.due is not None
                      and t.due <= now), key=lambda t: t.due or 0)
        for timer in due:
            if timer.cancelled or timer.due is None:  # cancelled by an earlier callback
                continue
            what = f"{kind} timer (every {timer.interval_ms} ms) of partition {clock.partition}"
            _call(what, clock.partition, timer.callback, now, sender)
            timer.due = next_due(timer.due, timer.interval_ms, now)

    # -- the wall clock, for the loop ---------------------------------------------------

    def due(self) -> bool:
        """True when a wall-clock timer or task is due now."""
        wait = self.seconds_until_due()
        return wait is not None and wait <= 0

    def seconds_until_due(self) -> float | None:
        """Seconds until the next wall-clock timer or task is due (0 or less: now);
        ``None`` when none is scheduled (or there is no wall clock)."""
        now = self.now()
        if now is None:
            return None
        dues = [s.due for s in self._tasks if s.due != NEVER]
        dues += [t.due for c in self._clocks.values() for t in c.timers
                 if t.kind == "wall_clock" and t.due is not None and not t.cancelled]
        dues += self._idle_dues()
        return None if not dues else (min(dues) - now) / 1000

    def stream_times(self) -> Mapping[int, int | None]:
        """Every open partition's stream time."""
        return {p: c.stream_time for p, c in self._clocks.items()}


def _call(what: str, partition: int | None, callback: Callable[[int, Sender], None],
          now: int, sender: Sender) -> None:
    """Run one timer or task callback with its output stamped ``now``; what it raises
    fails the turn, as ``process()`` raising does."""
    sender.timestamp = now
    try:
        callback(now, sender)
    except KasperError:
        raise
    except Exception as exc:
        raise ProcessingError(f"{what} raised {type(exc).__name__}: {exc}",
                              partition=partition) from exc


def _always() -> bool:
    return True
