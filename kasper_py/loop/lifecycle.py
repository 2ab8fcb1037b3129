"""How a loop stops, between threads: ``run_loop`` runs on one thread; ``close`` comes
from any thread (and waits for the loop to stop), from a signal handler on the loop's
own thread (and returns at once), or before the loop ever ran; the loop shuts down
once. And which failures leave Kafka fit for a last commit.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from kasper_py.exceptions import CommitError, ConsumeError, FencedError, ProduceError

__all__ = ["Lifecycle", "kafka_usable_after"]

_KAFKA_TROUBLE = (ProduceError, CommitError, ConsumeError, FencedError, KeyboardInterrupt)


def kafka_usable_after(exc: BaseException) -> bool:
    """False after Kafka trouble (or an impatient user): then there is no last commit,
    and queued output of the failed batch is dropped, not waited for (the batch is
    replayed anyway)."""
    return not isinstance(exc, _KAFKA_TROUBLE)


class Lifecycle:
    """The stop protocol of one loop."""

    def __init__(self) -> None:
        self.closing = threading.Event()
        """Set by ``close``: the loop stops after the turn in hand."""
        self.started = False
        """Partitions were taken (or the group joined): a stopped note is due at close."""
        self.shut = False
        """Shut down (or killed): nothing runs again."""
        self._stopped = threading.Event()
        self._loop_thread: int | None = None
        self._lock = threading.Lock()

    @contextmanager
    def running(self) -> Iterator[None]:
        """The loop runs on this thread while inside; on the way out it counts as
        stopped, and a ``close`` waiting on another thread returns."""
        self._loop_thread = threading.get_ident()
        self._stopped.clear()
        try:
            yield
        finally:
            self._loop_thread = None
            self._stopped.set()

    def close(self, shutdown: Callable[[], None], timeout: float | None = None) -> None:
        """Ask the loop to stop. With no loop running, ``shutdown`` at once; from another
        thread, wait up to ``timeout`` for the loop to stop (it shuts down itself); from
        the loop's own thread (a signal handler), return at once."""
        self.closing.set()
        loop_thread = self._loop_thread
        if loop_thread is None:
            shutdown()
        elif loop_thread != threading.get_ident():
            self._stopped.wait(timeout)

    def shut_once(self) -> bool:
        """True the first time only: the caller is the one to shut the loop down."""
        with self._lock:
            if self.shut:
                return False
            self.shut = True
            return True
