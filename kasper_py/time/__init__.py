"""Time: event time (``Config.timestamp_extractor``), stream time per partition,
timers (``ProcessorContext.schedule``) and scheduled tasks (``Task``). The turn engine
keeps and fires them inside its turns (``keeper.py``), so what they send and write is
committed like ``process()`` output; windowed tables live in ``kasper_py.windows``.
"""

from kasper_py.time._clock import PartitionClock, Timer, TimerCallback, TimerKind
from kasper_py.time._extractor import (
    EventTimeError,
    TimestampExtractor,
    event_time,
    extractor_for,
)
from kasper_py.time._tasks import Task, TaskFunction

__all__ = ["EventTimeError", "PartitionClock", "Task", "TaskFunction", "Timer",
           "TimerCallback", "TimerKind", "TimestampExtractor", "event_time", "extractor_for"]
