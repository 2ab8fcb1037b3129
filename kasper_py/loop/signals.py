"""SIGTERM and SIGINT closing a running loop gracefully (``run_until_stopped``); a second
signal stops it at once. A signal held since the process started (``kasper run``,
``kasper_py._support.signals``) is taken over: the loop then does not run at all."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import structlog

from kasper_py._support.signals import STOPPING, take_held
from kasper_py.exceptions import KasperError

__all__ = ["closing_on_signals"]

_log = structlog.get_logger("kasper_py")


@contextmanager
def closing_on_signals(close: Callable[[], object], processor: str) -> Iterator[list[str]]:
    """While inside, SIGTERM and SIGINT call ``close``; a second one raises
    ``KeyboardInterrupt``. Yields the names of the signals caught, in order (one held
    before, already, and ``close`` called); the previous handlers are restored on the
    way out. Raises ``KasperError`` off the main
    thread, where Python runs no signal handlers."""
    if threading.current_thread() is not threading.main_thread():
        raise KasperError(f"processor {processor!r}: run_until_stopped() must be "
                          "called from the main thread, where Python handles signals")
    caught: list[str] = []

    def handle(signum: int, _frame: Any) -> None:
        # only state changes here: logging from a handler could re-enter a stream
        if caught:
            raise KeyboardInterrupt
        caught.append(signal.Signals(signum).name)
        close()

    previous = {sig: signal.signal(sig, handle) for sig in STOPPING}
    held = take_held()
    if held is not None and not caught:  # came before these handlers: close now
        caught.append(held)
        close()
    try:
        yield caught
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if caught:
        _log.info("kasper.stopped_by_signal", processor=processor, signal=caught[0])
