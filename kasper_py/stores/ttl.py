"""``Ttl``: how long a table keeps a key after its last write, and how many expired
keys one turn removes at most. The tables that take it (rocksdb.py, memory.py) keep
their own time index; Redis and Cassandra hand expiry to the server.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Clock", "Ttl", "now_ms"]

Clock = Callable[[], float]
"""Seconds since the epoch: ``time.time``, or a test driver's wall clock."""

_SWEEP_LIMIT = 10_000


@dataclass(frozen=True)
class Ttl:
    """A key expires ``seconds`` after its last write (the wall clock of the turn that
    wrote it); each turn removes at most ``sweep_limit`` expired keys, oldest first,
    so a turn's cost stays bounded however many keys expire at once."""

    seconds: float
    sweep_limit: int = _SWEEP_LIMIT

    def __post_init__(self) -> None:
        if isinstance(self.seconds, bool) or not self.seconds > 0:
            raise ValueError(f"ttl must be a positive number of seconds, got {self.seconds!r}")
        if self.sweep_limit < 1:
            raise ValueError(f"ttl sweep_limit must be at least 1, got {self.sweep_limit!r}")

    @property
    def ms(self) -> int:
        """``seconds`` in whole milliseconds (at least one)."""
        return max(1, round(self.seconds * 1000))

    @classmethod
    def of(cls, ttl: float | Ttl | None) -> Ttl | None:
        """``ttl`` as a ``Ttl``: seconds take the default sweep limit; ``None`` is none."""
        if ttl is None or isinstance(ttl, Ttl):
            return ttl
        return cls(ttl)


def now_ms(clock: Clock = time.time) -> int:
    """``clock()`` in whole milliseconds."""
    return int(clock() * 1000)
