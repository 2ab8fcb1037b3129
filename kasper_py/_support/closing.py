"""Closing several resources where one failing close must neither hide the error that
caused the shutdown nor keep the others open. Used by the loop and the Spark task."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import structlog

__all__ = ["close_all"]

_log = structlog.get_logger("kasper_py")


def close_all(steps: Iterable[Callable[[], object]], processor: str) -> None:
    """Call every step; a step that raises is logged (``kasper.close_failed``) and the
    next one still runs. ``KeyboardInterrupt`` and other ``BaseException``s pass."""
    for step in steps:
        try:
            step()
        except Exception:
            _log.exception("kasper.close_failed", processor=processor,
                           step=getattr(step, "__qualname__", repr(step)))
