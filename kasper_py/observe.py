"""What the loop reports after each turn, and the no-op observer used when
metrics are off. Prometheus lives in ``metrics.py`` and is imported only there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from kasper_py.batching import Batch

__all__ = ["LoopObserver", "NoopObserver", "TurnStats"]

STEPS = ("process", "flush", "produce", "commit")


@dataclass
class TurnStats:
    """One completed (committed) turn: its input, its output and how long each step took."""

    batch: Batch
    produced: int
    durations: dict[str, float] = field(default_factory=dict)
    """Seconds per step: process, flush, produce, commit."""
    committed: dict[tuple[str, int], int] = field(default_factory=dict)
    """Next offset to read per assigned (topic, partition), as committed so far; where
    nothing is committed yet, where ``auto_offset_reset`` starts (from the watermarks)."""
    high_watermarks: dict[tuple[str, int], int] = field(default_factory=dict)
    """Latest known high watermark per assigned (topic, partition), from fetch responses."""


class LoopObserver(Protocol):
    """Receives the loop's events; metrics and health implement it."""

    def on_start(self, assigned: list[tuple[str, int]]) -> None:
        """Partitions are assigned and stores restored; processing begins."""

    def on_turn(self, stats: TurnStats) -> None:
        """A turn was committed."""

    def on_idle(self) -> None:
        """A poll returned nothing, or a turn is still waiting for its acks (about once
        a second, up to ``delivery_timeout``): the loop is alive."""

    def on_error(self, error: BaseException) -> None:
        """The loop is stopping on ``error``."""

    def on_stop(self) -> None:
        """The loop has stopped."""


class NoopObserver:
    """Observes nothing: the default when metrics are disabled."""

    def on_start(self, assigned: list[tuple[str, int]]) -> None:
        pass

    def on_turn(self, stats: TurnStats) -> None:
        pass

    def on_idle(self) -> None:
        pass

    def on_error(self, error: BaseException) -> None:
        pass

    def on_stop(self) -> None:
        pass
