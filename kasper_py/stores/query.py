"""What queries call on a store (``Queryable``: committed state, from any thread) and
the scan they pass (``Scan``, ``ScanPage``, the key-range helpers the backends share).
The loop's calls are in lifecycle.py, a processor's in base.py.
"""

from __future__ import annotations

from abc import ABC
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kasper_py.exceptions import BadQueryError

__all__ = ["Queryable", "Scan", "ScanPage", "WarmCopy", "WarmStores", "in_range", "next_key",
           "prefix_end"]


@dataclass(frozen=True)
class Scan:
    """A query's scan of one partition's store, in the key serde's bytes: keys starting
    with ``prefix``, from ``start`` (inclusive) to ``end`` (exclusive), after ``cursor``
    (where the last page stopped, as the backend wrote it), at most ``limit`` of them."""

    prefix: bytes = b""
    start: bytes | None = None
    end: bytes | None = None
    cursor: str | None = None
    limit: int = 100

    def bounds(self) -> tuple[bytes, bytes | None]:
        """The scan as one key range ``[lower, upper)`` (``upper`` ``None``: no end)."""
        lower = max(self.start or b"", self.prefix)
        upper = self.end
        after = prefix_end(self.prefix) if self.prefix else None
        if after is not None and (upper is None or after < upper):
            upper = after
        return lower, upper

    def ranged(self) -> bool:
        """True when the scan asks for a key range (``start`` or ``end``), not only a prefix."""
        return self.start is not None or self.end is not None

    def refuse_range(self, backend: str, why: str) -> None:
        """Raise ``BadQueryError`` for a range scan ``backend`` cannot do, saying ``why``."""
        if self.ranged():
            raise BadQueryError(f"{backend} tables cannot be scanned by key range: {why}; "
                                "scan with prefix= only")


@dataclass(frozen=True)
class ScanPage:
    """One page of a scan: (key, value) pairs decoded with the store's serdes, and the
    cursor of the next page (``None``: the scan is done)."""

    items: list[tuple[Any, Any]]
    cursor: str | None
    ordered: bool
    """True when ``items`` are in key-byte order (and pages follow each other in it)."""


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key above every key starting with ``prefix`` (``None``: no such key,
    the prefix is all 0xff bytes)."""
    stripped = prefix.rstrip(b"\xff")
    return stripped[:-1] + bytes([stripped[-1] + 1]) if stripped else None


def next_key(key: bytes) -> bytes:
    """The smallest key above ``key``: where the page after ``key`` starts."""
    return key + b"\x00"


def in_range(key: bytes, lower: bytes, upper: bytes | None) -> bool:
    """True when ``lower <= key < upper``."""
    return key >= lower and (upper is None or key < upper)


class Queryable(ABC):  # noqa: B024 - every method has a default: "cannot be queried"
    """The query path of a store: committed state, read from any thread.

    The loop owns the store; queries come from other threads (the HTTP server's).
    These never read the turn's pending writes, never report to the store's observer,
    and never wait on the loop for longer than one read. ``query.Tables`` reads stores
    through this interface only.
    """

    def query_get_many(self, keys: Iterable[Any]) -> dict[Any, Any]:
        """Committed values of the keys that exist, for a query from any thread."""
        raise BadQueryError(f"{type(self).__name__} cannot be queried")

    def query_scan(self, scan: Scan) -> ScanPage:
        """One page of committed (key, value) pairs, for a query from any thread."""
        raise BadQueryError(f"{type(self).__name__} cannot be scanned")


class WarmCopy(Queryable):
    """A standby's warm copy of one table partition, as queries read it
    (``stores.standby``)."""

    lag: int = 0
    """Changelog offsets behind the copy's end, as last measured."""


WarmStores = Callable[[], Mapping[int, Mapping[str, WarmCopy]]]
"""The standby copies kept in this process, by partition and table."""
