"""Where the Kafka clients' own log lines go: librdkafka's lines, handed over by
confluent-kafka, become ``kasper.client_log`` events of the library's structlog stream,
at the library's levels, with repeats held back and every line counted. Every client
the library creates gets its ``logger`` from ``with_client_log``. The lines are counted
by whoever registered with ``count_lines_with`` (the Prometheus metrics, once an
observer exists), so ``kafka/`` reaches up to no metrics module.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

import structlog

from kasper_py._support.secrets import masked_fields

__all__ = ["ClientLog", "LineCounter", "RepeatLimiter", "count_lines_with", "with_client_log"]

ClientKind = Literal["consumer", "producer", "admin"]
REPEAT_INTERVAL = 30.0
"""Seconds during which a repeated line is counted but not logged again."""

# confluent-kafka has already mapped librdkafka's syslog levels to Python's (0-2 critical,
# 3 error, 4 warning, 5-6 info, 7 debug). librdkafka logs a refused or lost connection at
# 3 and retries it by itself; what the loop cannot recover from reaches it as an error
# (consume, delivery, commit), so a client's "error" line is only a warning here.
_LEVELS = {logging.CRITICAL: logging.ERROR, logging.ERROR: logging.WARNING}
# Parts of a line that change between repeats of the same event: timings ("after 0ms")
# and librdkafka's own suppression count ("3 identical error(s) suppressed").
_VARYING = re.compile(r"\d+(?=ms\b)|\d+(?= identical error)")
_MAX_KEYS = 1024

_log = structlog.get_logger("kasper_py")

LineCounter = Callable[[str, ClientKind, str], None]
"""Counts one client log line: ``(processor, client, level)``, at the level it is logged at."""
_counters: tuple[LineCounter, ...] = ()
_counters_lock = threading.Lock()


def count_lines_with(counter: LineCounter) -> None:
    """Have ``counter`` count every client's log lines from now on (once, however often
    it is registered). Clients are built before any metrics exist, so the metrics hand
    their counter in here rather than the clients reaching up for it."""
    global _counters  # noqa: PLW0603 - replaced whole, so a line being logged reads one tuple
    with _counters_lock:
        if counter not in _counters:
            _counters = (*_counters, counter)


def with_client_log(conf: Mapping[str, Any], processor: str,
                    client: ClientKind) -> dict[str, Any]:
    """``conf`` with a ``logger`` routing the client's lines through ``ClientLog``.

    Without one, librdkafka prints its lines straight to stderr (``%3|...|FAIL|...``),
    unmasked and outside the JSON stream. confluent-kafka delivers them during the
    client's poll, consume and flush calls; an admin client must be polled for them.
    """
    return {**conf, "logger": ClientLog(processor, client)}


class RepeatLimiter:
    """Lets a key through at most once per ``interval`` seconds, and says how many
    times it was held back since it last went through."""

    def __init__(self, interval: float = REPEAT_INTERVAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._interval = interval
        self._clock = clock
        self._seen: dict[Any, tuple[float, int]] = {}  # key -> (last let through, held back)
        self._lock = threading.Lock()

    def admit(self, key: Any) -> int | None:
        """``None`` to hold this occurrence back; else the number held back before it."""
        now = self._clock()
        with self._lock:
            last = self._seen.get(key)
            if last is not None and now - last[0] < self._interval:
                self._seen[key] = (last[0], last[1] + 1)
                return None
            if last is None and len(self._seen) >= _MAX_KEYS:
                self._forget_before(now - self._interval)
            self._seen[key] = (now, 0)
            return 0 if last is None else last[1]

    def _forget_before(self, cutoff: float) -> None:
        """Bound the memory when lines keep changing (their held-back counts are lost)."""
        self._seen = {k: v for k, v in self._seen.items() if v[0] >= cutoff}
        if len(self._seen) >= _MAX_KEYS:
            self._seen.clear()


class ClientLog:
    """The ``logger`` of one Kafka client: confluent-kafka calls
    ``log(level, "%s [%s] %s", facility, client_name, text)`` for each librdkafka line."""

    def __init__(self, processor: str, client: ClientKind,
                 limiter: RepeatLimiter | None = None) -> None:
        self.processor = processor
        self.client = client
        self._limiter = limiter or RepeatLimiter()

    def log(self, level: int, msg: str, *args: Any, **_kwargs: Any) -> None:
        """Count the line; log it unless it repeats within the limiter's interval."""
        facility, client_name, text = _parts(msg, args)
        emitted = _LEVELS.get(level, level)
        for count in _counters:
            count(self.processor, self.client, logging.getLevelName(emitted).lower())
        suppressed = self._limiter.admit((facility, _VARYING.sub("N", text)))
        if suppressed is None:
            return
        fields = {"processor": self.processor, "client": self.client,
                  "client_name": client_name, "facility": facility,
                  "rdkafka_level": logging.getLevelName(level).lower(),
                  "suppressed": suppressed, "message": text}
        # Masked here too: client lines may quote settings, and an application may
        # have configured structlog without the library's processors.
        _log.log(emitted, "kasper.client_log", **masked_fields(fields))


def _parts(msg: str, args: tuple[Any, ...]) -> tuple[str, str, str]:
    """(facility, client name, text) of a line, whatever shape it came in."""
    if len(args) == 3:
        facility, client_name, text = (str(arg) for arg in args)
        return facility, client_name, text
    return "", "", msg % args if args else msg
