"""Input set aside rather than processed: records that do not decode
(``Config.on_decode_error``) and messages ``process()`` fails on
(``Config.on_process_error``). Both become a ``DeadLetter``: the record as it was read,
with the error; here they are logged and sent to the dead-letter topic, one way for
every runner (the loop, the Spark task, the testing driver).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import structlog

from kasper_py.exceptions import DeadLetterLimitError
from kasper_py.message import DeadLetter, Message, Undecodable
from kasper_py.sender import Sender

if TYPE_CHECKING:
    from kasper_py.config import Config

# DeadLetter and Undecodable, the records set aside, are message.py's (kafka/ builds
# them); named here too, where they have always been importable from.
__all__ = ["DeadLetter", "DeadLetterLimits", "Undecodable", "bisect_failures",
           "dead_letter_headers", "send_aside"]

_MINUTE = 60.0

_log = structlog.get_logger("kasper_py")


def dead_letter_headers(letter: DeadLetter, processor: str) -> list[tuple[str, bytes | None]]:
    """The record's own headers, then where it came from and why it was set aside."""
    record = letter.record
    headers: list[tuple[str, bytes | None]] = list(record.headers)
    headers += [
        ("kasper.error", letter.error.encode()),
        ("kasper.error.type", letter.error_type.encode()),
        ("kasper.processor", processor.encode()),
        ("kasper.source.topic", record.topic.encode()),
        ("kasper.source.partition", str(record.partition).encode()),
        ("kasper.source.offset", str(record.offset).encode()),
    ]
    if record.timestamp is not None:
        headers.append(("kasper.source.timestamp", str(record.timestamp).encode()))
    return headers


_EVENTS = {"decode": "kasper.undecodable", "process": "kasper.dead_letter"}


def send_aside(letters: Sequence[DeadLetter], config: Config, sender: Sender) -> None:
    """Log every set-aside record (a warning with its source coordinates and error) and,
    where its policy is ``dead_letter``, buffer its original key, value and headers for
    ``dead_letter_topic``, so it is produced and acked before the commit."""
    topic = config.dead_letter_topic
    for letter in letters:
        record = letter.record
        policy = config.on_decode_error if letter.reason == "decode" else config.on_process_error
        _log.warning(_EVENTS[letter.reason], processor=config.name, topic=record.topic,
                     partition=record.partition, offset=record.offset, error=letter.error,
                     error_type=letter.error_type, policy=policy, dead_letter_topic=topic)
        if topic is not None and policy == "dead_letter":
            sender.send(topic, record.value, record.key,
                        headers=dead_letter_headers(letter, config.name))


Attempt = Callable[[list[Message]], "Exception | None"]
"""Process a run of messages: ``None`` when it succeeded (its effects stay), else what
``process()`` raised (its effects undone, the processor rebuilt)."""


def bisect_failures(messages: list[Message], error: Exception, attempt: Attempt,
                    found: Callable[[Message, Exception], None]) -> None:
    """``messages`` failed as a whole with ``error`` (and were undone): retry each half
    in order with ``attempt``, and the halves of a half that fails, down to single
    messages; ``found`` gets each message that fails alone, with its error. Every other
    message is processed once, in its original order. Costs about
    ``2 * failures * log2(len(messages))`` attempts; ``found`` may raise to stop."""
    if len(messages) == 1:
        found(messages[0], error)
        return
    middle = len(messages) // 2
    for half in (messages[:middle], messages[middle:]):
        failed = attempt(half)
        if failed is not None:
            bisect_failures(half, failed, attempt, found)


class DeadLetterLimits:
    """The limits of ``Config.on_process_error="dead_letter"``: dead letters per turn,
    per minute, and their ratio to the messages processed in the last minute. A turn
    counts once it is committed (``record``); ``check`` counts the turn in hand too."""

    def __init__(self, config: Config, clock: Callable[[], float] = time.monotonic) -> None:
        self._per_turn = config.dead_letter_max_per_turn
        self._per_minute = config.dead_letter_max_per_minute
        self._ratio = config.dead_letter_max_ratio
        self._clock = clock
        self._turns: deque[tuple[float, int, int]] = deque()
        """(when, dead letters, messages) of the committed turns of the last minute."""

    def check(self, dead: int, messages: int | None = None, where: str = "",
              partition: int | None = None) -> None:
        """Raise ``DeadLetterLimitError`` when ``dead`` dead letters in the turn in hand
        pass a count limit, or (given the turn's ``messages``) the ratio."""
        recent_dead, recent_messages = self._recent()
        passed: tuple[str, float, str] | None = None
        if self._per_turn is not None and dead > self._per_turn:
            passed = ("dead_letter_max_per_turn", self._per_turn, f"{dead} in this turn")
        elif self._per_minute is not None and recent_dead + dead > self._per_minute:
            passed = ("dead_letter_max_per_minute", self._per_minute,
                      f"{recent_dead + dead} in the last minute")
        elif (messages is not None and self._ratio is not None and dead
              and (recent_dead + dead) / max(recent_messages + messages, 1) > self._ratio):
            passed = ("dead_letter_max_ratio", self._ratio, f"{recent_dead + dead} of "
                      f"{recent_messages + messages} messages in the last minute")
        if passed is not None:
            field, limit, seen = passed
            raise DeadLetterLimitError(
                f"too many messages failed process(): {seen}, over {field}={limit}"
                f"{f' ({where})' if where else ''}; the failures look systematic, so the "
                "loop stops rather than dead-letter them", partition=partition, limit=field)

    def record(self, dead: int, messages: int) -> None:
        """A turn with ``dead`` dead letters among ``messages`` was committed."""
        if dead or self._ratio is not None:
            self._turns.append((self._clock(), dead, messages))

    def _recent(self) -> tuple[int, int]:
        since = self._clock() - _MINUTE
        while self._turns and self._turns[0][0] <= since:
            self._turns.popleft()
        return sum(t[1] for t in self._turns), sum(t[2] for t in self._turns)
