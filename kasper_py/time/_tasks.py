"""``Task``: a function a processor runs on a schedule of the wall clock, every so
many seconds or on a cron expression (croniter), independent of its input. The turn
engine runs it (``keeper.py``); a task only says when it is due.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, tzinfo
from typing import TYPE_CHECKING

from croniter import croniter

from kasper_py.exceptions import ConfigError
from kasper_py.time._clock import interval_ms, next_due

if TYPE_CHECKING:
    from kasper_py.sender import Sender

__all__ = ["NEVER", "Task", "TaskFunction"]

NEVER = 2**62
"""The due time of a one-time task that ran: never again in this process."""

TaskFunction = Callable[[int, "Sender"], None]
"""``fn(timestamp_ms, sender)``: the wall-clock time it runs at, and the turn's ``Sender``."""


class Task:
    """Run ``fn(timestamp_ms, sender)`` every ``every`` seconds, or at the times of a
    ``cron`` expression (five fields, minute first, as crontab; evaluated in
    ``timezone``, UTC by default), on the wall clock, with or without input.

    Pass tasks as ``TopicProcessor(..., tasks=[...])`` or ``ProcessorDriver(...,
    tasks=[...])``. A task runs inside a turn of the loop, so its output and store
    writes are committed with that turn (at-least-once, or in its transaction); when it
    raises, the turn fails uncommitted like a failing ``process()``. An ``every`` task
    first runs one interval after the loop starts; a ``cron`` task at the first match
    after the start. Runs missed while a turn was busy are skipped, not caught up.
    Every process running the processor runs its tasks (one per partition set); with
    ``on_leader``, only the process that leads the app's processes runs it, one at a
    time (static or group mode, any number of processes): the processes elect it
    through a Kafka consumer group (``kasper_py.loop.leader``); the lead moves at once
    when that process closes, within the 6 s session timeout and a rebalance when it
    dies; a run due where the process does not lead is skipped there. See
    docs/time-and-windows.md, "Leader-only tasks" (and docs/applications.md).
    Invalid arguments, a bad cron expression included, raise ``ConfigError``.

    One-time tasks, as Kaspr's: ``once=True`` runs ``fn`` once per start of the
    process, in its first turn; ``delay=`` seconds (with or without ``once``) once,
    that long after the start. With ``on_leader`` a one-time task runs in the process
    that leads: one not leading when it falls due keeps it pending until it leads (the
    election takes a moment at start), so it runs in one process, and again only where
    the lead moves to after that process ends.
    """

    def __init__(self, fn: TaskFunction, *, every: float | None = None,
                 cron: str | None = None, name: str | None = None,
                 timezone: tzinfo = UTC, on_leader: bool = False, once: bool = False,
                 delay: float | None = None) -> None:
        self.name = name or getattr(fn, "__qualname__", None) or repr(fn)
        """Names the task in logs and errors; the function's name by default."""
        if not callable(fn):
            raise ConfigError("tasks", f"task {self.name!r}: fn must be callable, got {fn!r}")
        self.once = bool(once) or delay is not None
        """Runs once per start (``once=True`` or a ``delay``)."""
        if [every is not None, cron is not None, self.once].count(True) != 1:
            raise ConfigError("tasks", f"task {self.name!r}: give exactly one of every= "
                              "(seconds) and cron= (an expression), or once=True or delay= "
                              f"(seconds) alone, got every={every!r}, cron={cron!r}, "
                              f"once={once!r}, delay={delay!r}")
        self.fn = fn
        self.every = every
        self.cron = cron
        self.timezone = timezone
        self.on_leader = bool(on_leader)
        """Run only in the process that leads (``TimeKeeper``'s ``leader``)."""
        self._every_ms = 0
        self._delay_ms = 0
        if delay is not None:
            if isinstance(delay, bool) or not isinstance(delay, int | float) or not (
                    0 <= delay < float("inf")):
                raise ConfigError("tasks", f"task {self.name!r}: delay must be seconds >= 0, "
                                  f"got {delay!r}")
            self._delay_ms = round(delay * 1000)
        if self.once:
            pass
        elif every is not None:
            try:
                self._every_ms = interval_ms(every, "every")
            except ValueError as exc:
                raise ConfigError("tasks", f"task {self.name!r}: {exc}") from None
        elif not isinstance(cron, str) or not croniter.is_valid(cron):
            raise ConfigError("tasks", f"task {self.name!r}: cron {cron!r} is not a valid cron "
                              "expression (five fields: minute hour day-of-month month "
                              "day-of-week, e.g. '*/5 * * * *')")

    def first_due(self, now: int) -> int:
        """When the task first runs, for a loop starting at ``now`` (ms since the epoch)."""
        if self.once:
            return now + self._delay_ms
        return now + self._every_ms if self.cron is None else self._cron_after(now)

    def next_due(self, due: int, now: int) -> int:
        """When it runs next, after the run due at ``due`` ran at ``now`` (a one-time
        task: ``NEVER``)."""
        if self.once:
            return NEVER
        return next_due(due, self._every_ms, now) if self.cron is None else self._cron_after(now)

    def _cron_after(self, now: int) -> int:
        assert self.cron is not None
        start = datetime.fromtimestamp(now / 1000, self.timezone)
        return round(croniter(self.cron, start).get_next(float) * 1000)

    def __repr__(self) -> str:
        schedule = (f"once, delay={self._delay_ms / 1000:g}" if self.once
                    else f"every={self.every!r}" if self.cron is None else f"cron={self.cron!r}")
        leader = ", on_leader=True" if self.on_leader else ""
        return f"Task({self.name!r}, {schedule}{leader})"
