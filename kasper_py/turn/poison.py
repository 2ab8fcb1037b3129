"""Poison messages (``on_process_error="dead_letter"``): when ``process()`` raises on a
partition's batch, the messages it fails on alone are found by bisection
(``dead_letters.bisect_failures``) and become dead letters; every attempt that fails
is undone first (the partition's store writes and output since, its stream time) and
its processor rebuilt. What is sent aside, and the limits, are ``dead_letters.py``'s.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from kasper_py.dead_letters import DeadLetter, DeadLetterLimits, bisect_failures
from kasper_py.kafka.batching import Batch
from kasper_py.message import Message
from kasper_py.sender import Sender
from kasper_py.time.keeper import TimeKeeper
from kasper_py.turn.partitions import PartitionState, store_call

__all__ = ["Apply", "Bisection", "ProcessRaisedError"]

_log = structlog.get_logger("kasper_py")

Apply = Callable[[int, list[Message], Batch, Sender], None]
"""Process a partition's messages (the engine's), raising ``ProcessRaisedError`` when
``process()`` raised."""


class ProcessRaisedError(Exception):
    """``process()`` raised ``error``, which may be a poison message's doing."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class Bisection:
    """Finds the messages ``process()`` fails on, for one engine."""

    def __init__(self, processor: str, time: TimeKeeper, limits: DeadLetterLimits, *,
                 apply: Apply, rebuild: Callable[[PartitionState], None]) -> None:
        """``apply`` processes messages of a partition; ``rebuild`` replaces a
        partition's processor with a fresh one after a failed attempt."""
        self.processor = processor
        self._time, self._limits = time, limits
        self._apply, self._rebuild = apply, rebuild

    def settle(self, state: PartitionState, messages: list[Message], batch: Batch,
               sender: Sender, failed: int) -> list[DeadLetter]:
        """Process ``state``'s ``messages``; when ``process()`` raises, find the messages
        it fails on alone by bisection and return them as dead letters (raising
        ``DeadLetterLimitError`` past the per-turn or per-minute limit, ``failed`` found
        in this turn already)."""
        partition = state.partition
        error = self._attempt(state, messages, batch, sender)
        if error is None:
            return []
        _log.warning("kasper.bisecting", processor=self.processor, partition=partition,
                     messages=len(messages), error=f"{type(error).__name__}: {error}")
        letters: list[DeadLetter] = []

        def found(message: Message, exc: Exception) -> None:
            letters.append(DeadLetter(batch.as_read(message), "process", str(exc),
                                      type(exc).__name__))
            self._limits.check(failed + len(letters), where=batch.describe(partition),
                               partition=partition)

        bisect_failures(messages, error, lambda run: self._attempt(state, run, batch, sender),
                        found)
        return letters

    def _attempt(self, state: PartitionState, messages: list[Message], batch: Batch,
                 sender: Sender) -> Exception | None:
        """Process ``messages`` of ``state``'s partition; when ``process()`` raises, undo
        what it did (the partition's store writes and output since, its stream time)
        and rebuild its processor, and return the exception."""
        partition = state.partition
        saved = {name: store_call(name, partition, store.savepoint)
                 for name, store in state.stores.items()}
        sent, clock = len(sender), self._time.mark(partition)
        try:
            self._apply(partition, messages, batch, sender)
        except ProcessRaisedError as failed:
            for name, store in state.stores.items():
                store_call(name, partition, store.rollback, saved[name])
            sender.truncate(sent)
            self._time.rollback(partition, clock)
            self._rebuild(state)
            return failed.error
        return None
