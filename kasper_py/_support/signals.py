"""SIGTERM and SIGINT held from the first moment of a ``kasper run`` process until the
loop (or the supervisor) installs its own handlers: a signal that arrives while the
library is imported, the configuration read or Kafka asked for metadata (a second or
more) is recorded here, not fatal, and ``take_held`` hands it on. Standard library only,
since it runs before anything else is imported.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["STOPPING", "held_signal", "holding_stop_signals", "take_held"]

STOPPING = (signal.SIGTERM, signal.SIGINT)
"""The signals that ask a process to stop gracefully."""

_held: list[str] = []


@contextmanager
def holding_stop_signals() -> Iterator[None]:
    """While inside, SIGTERM and SIGINT are recorded (a second one raises
    ``KeyboardInterrupt``, a forced stop, as in the loop); the previous handlers and
    signal mask are restored on the way out. The signals are unblocked once the
    handlers are in place: a parent may start the process with them blocked, so that
    one sent at once waits for these handlers instead of killing it. Off the main
    thread, where Python runs no signal handlers, nothing is changed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _hold) for sig in STOPPING}
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPPING)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _held.clear()


def _hold(signum: int, _frame: Any) -> None:
    if _held:
        raise KeyboardInterrupt
    _held.append(signal.Signals(signum).name)


def held_signal() -> str | None:
    """The name of the signal held so far, if any."""
    return _held[0] if _held else None


def take_held() -> str | None:
    """The held signal's name, handed to a caller that has just installed handlers of its
    own (and now owns the stop); ``None`` when none came."""
    name = held_signal()
    _held.clear()
    return name
