"""``MemoryChangelogs``: the changelog topics of ``ProcessorDriver``'s local tables, held
in memory. The driver appends what a RocksDB table writes to its changelog once the
turn is acked (committed, with exactly-once: a transaction's marker takes an offset, as
in Kafka); a table opened on them restores from them, so a second driver given the same
changelogs and a fresh ``state_dir`` is a restart on another machine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kasper_py.message import Headers
from kasper_py.observability.observe import StoreObserver

__all__ = ["MemoryChangelogs"]


@dataclass(frozen=True)
class _Record:
    """A changelog record as the restore reads it (confluent-kafka's accessors)."""

    _key: bytes | None
    _value: bytes | None
    _offset: int
    _timestamp: int = 0
    _headers: tuple[tuple[str, bytes | None], ...] = ()

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        """(create time, milliseconds), as the producer set it."""
        return 1, self._timestamp

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        """The headers as produced, ``None`` without any (as confluent-kafka returns)."""
        return list(self._headers) if self._headers else None


_MARKER = None
"""A transaction's commit marker: it takes an offset, and no reader returns it."""


class MemoryChangelogs:
    """Changelog topics by name, each a list of records (or markers) per partition."""

    def __init__(self) -> None:
        self._topics: dict[str, dict[int, list[_Record | None]]] = {}

    def append(self, topic: str, partition: int, key: bytes | None, value: bytes | None,
               timestamp: int = 0, *, headers: Headers | None = None) -> None:
        """One record at the end of ``topic``'s ``partition`` (``timestamp`` in ms)."""
        log = self._log(topic, partition)
        log.append(_Record(key, value, len(log), timestamp, headers or ()))

    def mark(self, topic: str, partition: int) -> None:
        """A transaction's commit marker at the end of ``topic``'s ``partition``."""
        self._log(topic, partition).append(_MARKER)

    def records(self, topic: str, partition: int = 0) -> list[tuple[bytes | None, bytes | None]]:
        """(key, value) of every record of ``topic``'s ``partition``, markers left out."""
        return [(r.key(), r.value()) for r in self._log(topic, partition) if r is not None]

    def reader(self, topic: str) -> _Reader:
        """A reader of ``topic`` (``stores.base.ChangelogSource``)."""
        return _Reader(self, topic)

    def _log(self, topic: str, partition: int) -> list[_Record | None]:
        return self._topics.setdefault(topic, {}).setdefault(partition, [])


class _Reader:
    """Reads one topic of ``MemoryChangelogs`` as ``ChangelogReader`` reads Kafka's."""

    def __init__(self, changelogs: MemoryChangelogs, topic: str) -> None:
        self._changelogs, self._topic = changelogs, topic
        self._positions: dict[int, int] = {}

    @property
    def positions(self) -> dict[int, int]:
        return dict(self._positions)

    def watermarks(self, partition: int) -> tuple[int, int]:
        return 0, len(self._changelogs._log(self._topic, partition))

    def assign(self, starts: Mapping[int, int]) -> None:
        self._positions = dict(starts)

    def unassign(self) -> None:
        self._positions = {}

    def read_until(self, ends: Mapping[int, int], apply: Callable[[int, list[Any]], None],
                   observer: StoreObserver, *, processor: str, table: str,
                   reason: str = "") -> int:
        count = 0
        for partition, end in ends.items():
            log = self._changelogs._log(self._topic, partition)
            records = [r for r in log[self._positions[partition]:end] if r is not None]
            if records:
                apply(partition, records)
                count += len(records)
            self._positions[partition] = max(self._positions[partition], end)
        return count

    def close(self) -> None:
        """Nothing to release."""
