"""structlog set-up for applications and the ``kasper`` CLI: JSON lines by default,
readable console output on a terminal, secrets masked. Importing kasper_py never
configures logging; only ``configure_logging()`` does, and the library only logs.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

from kasper_py._support.secrets import MASK, masked_fields, scrub

__all__ = ["MASK", "configure_logging", "mask_secrets"]


def mask_secrets(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """A structlog processor: hide values whose key names a secret (SASL passwords,
    SSL keys, tokens), in nested mappings too, ``key=value`` secrets inside text, and
    every client-setting value the library masks (``kasper_py._support.secrets``'s
    ``masked_fields``)."""
    return masked_fields(event_dict)


def configure_logging(json: bool | None = None, level: int | str = "INFO",
                      stream: TextIO | None = None) -> None:
    """Configure structlog (and route the standard ``logging`` module through it).

    ``json=None`` picks JSON lines unless ``stream`` (default stderr) is a terminal, where
    a console renderer is easier to read. ``level`` is a name (``"DEBUG"``) or a number.
    """
    stream = stream or sys.stderr
    if json is None:
        json = not _is_tty(stream)
    number = _level_number(level)
    shared = _shared_processors()
    renderer = _renderer(json, colors=_is_tty(stream))
    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(number),
        # One write per line (print() writes the line, then the newline): workers of
        # `kasper run --processes N` share the supervisor's stderr, and their lines
        # must not interleave.
        logger_factory=structlog.WriteLoggerFactory(stream),
        cache_logger_on_first_use=False,  # keeps structlog.testing.capture_logs working
    )
    _route_stdlib(shared, renderer, number, stream)


def _shared_processors() -> list[Processor]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
        mask_secrets,
    ]


def _renderer(json: bool, colors: bool) -> Processor:
    renderer: Processor = _JsonRenderer() if json else structlog.dev.ConsoleRenderer(
        colors=colors)

    def scrubbed(logger: WrappedLogger, method: str, event_dict: EventDict) -> str:
        # the last line of defence: exception texts and tracebacks are rendered here,
        # after mask_secrets ran, and may quote a client setting's value
        return scrub(str(renderer(logger, method, event_dict)))

    return scrubbed


class _JsonRenderer:
    """One JSON object per line: timestamp, level and event first; exceptions as
    structured dicts without local variables (they may hold secrets)."""

    _FIRST = ("timestamp", "level", "event")

    def __init__(self) -> None:
        transformer = structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
        self._tracebacks = structlog.processors.ExceptionRenderer(transformer)
        self._render = structlog.processors.JSONRenderer()

    def __call__(self, logger: WrappedLogger, method: str,
                 event_dict: MutableMapping[str, Any]) -> str:
        event_dict = self._tracebacks(logger, method, event_dict)
        ordered = {k: event_dict[k] for k in self._FIRST if k in event_dict}
        ordered.update(event_dict)
        rendered = self._render(logger, method, ordered)
        return rendered if isinstance(rendered, str) else rendered.decode()


def _route_stdlib(shared: list[Processor], renderer: Processor, level: int,
                  stream: TextIO) -> None:
    """Send records of the standard ``logging`` module (client libraries) through the
    same processors, so every line has one format."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
    ))
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_kasper", False)]:
        root.removeHandler(old)
    handler._kasper = True  # type: ignore[attr-defined]  # marks the handler we own
    root.addHandler(handler)
    root.setLevel(level)


def _level_number(level: int | str) -> int:
    if isinstance(level, int):
        return level
    number = logging.getLevelNamesMapping().get(level.upper())
    if number is None:
        raise ValueError(f"unknown log level {level!r}: use DEBUG, INFO, WARNING or ERROR")
    return number


def _is_tty(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())
