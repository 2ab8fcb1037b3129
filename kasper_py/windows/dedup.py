"""``Deduplicator``: windowed deduplication inside ``process()``: the first record of
each id passes, and later records of that id within ``within`` seconds of event time are
dropped; what it remembers lives in a local table, so restores and exactly-once keep it
exact.

Entries in the store (see _state.py): ``d<id><first occurrence's time><0>`` -> ``b""``.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import structlog

from kasper_py.processor import ProcessorContext
from kasper_py.serdes import Serde
from kasper_py.windows._state import TimedState, check_timestamp, pack_times
from kasper_py.windows.kinds import Duration, to_millis

__all__ = ["Deduplicator"]

T = TypeVar("T")
_TAG = b"d"
_log = structlog.get_logger("kasper_py")


class Deduplicator(TimedState):
    """Drops repeated records of an id within ``within`` seconds of event time, in the
    local table ``store`` (declared with ``key_serde="bytes", value_serde="bytes"``; a
    ``RocksDBTable`` keeps it across restarts through its changelog).

    The rule, record by record in the partition's order: stream time is the largest
    event time seen, this record's included. An id's *occurrence* is the time ``first``
    of the record that last passed; it is held until stream time reaches
    ``first + within``, then forgotten (its entry deleted). A record whose id has an
    occurrence held and whose event time is before ``first + within`` is a duplicate:
    dropped (counted in ``duplicates``). Any other record passes and becomes its id's
    occurrence. So the first occurrence wins; the result depends only on the records and
    their order, never on where batches were cut, and a replay of the same input (a
    restart, Spark's reprocessing) drops the same records. A duplicate arriving after
    stream time passed ``first + within`` passes again: choose ``within`` as the longest
    time, in event time, over which your upstream may repeat a record.
    """

    def __init__(self, context: ProcessorContext, store: str, *, within: Duration,
                 key_serde: str | Serde = "str") -> None:
        self.within_ms = to_millis("deduplication window (within)", within, positive=True)
        self._held: dict[bytes, int] = {}
        """id bytes -> time of its occurrence held."""
        self._expiry: list[tuple[int, bytes, int]] = []
        """(first + within, id bytes, first): a min-heap, entries of replaced occurrences
        left in until they come first."""
        self.duplicates = 0
        """Records dropped as duplicates (since this object was built)."""
        super().__init__(context, store, key_serde)

    def first_occurrences(self, records: Iterable[T], id_of: Callable[[T], Any],
                          time_of: Callable[[T], int | None]) -> list[T]:
        """The records of one batch that pass, in their order: ``id_of(record)`` is its
        id (hashable, encoded with ``key_serde``), ``time_of(record)`` its event time in
        ms (``Message.timestamp``, or an extracted event time)."""
        self._sync()
        kept: list[T] = []
        writes: dict[bytes, bytes | None] = {}
        for record in records:
            key = id_of(record)
            timestamp = check_timestamp(key, time_of(record))
            self.stream_time = max(self.stream_time, timestamp)
            self._forget_expired(writes)
            encoded = self._key_of(key)
            first = self._held.get(encoded)
            if first is not None and timestamp < first + self.within_ms:
                self.duplicates += 1
                _log.debug("kasper.duplicate", store=self.store_name, key=key,
                           timestamp=timestamp, first=first)
                continue
            if first is not None:
                writes[pack_times(_TAG, encoded, first, 0)] = None
            self._hold(encoded, timestamp)
            writes[pack_times(_TAG, encoded, timestamp, 0)] = b""
            kept.append(record)
        self.store.put_many(writes)
        self._end_batch()
        return kept

    def _hold(self, encoded: bytes, first: int) -> None:
        self._held[encoded] = first
        heapq.heappush(self._expiry, (first + self.within_ms, encoded, first))

    def _forget_expired(self, writes: dict[bytes, bytes | None]) -> None:
        """Forget the occurrences whose window stream time has reached."""
        expiry, held = self._expiry, self._held
        while expiry and expiry[0][0] <= self.stream_time:
            _, encoded, first = heapq.heappop(expiry)
            if held.get(encoded) == first:
                del held[encoded]
                writes[pack_times(_TAG, encoded, first, 0)] = None

    # -- TimedState -------------------------------------------------------------------

    def _clear(self) -> None:
        self._held.clear()
        self._expiry.clear()

    def _load(self, tag: bytes, key: bytes, first: int, second: int) -> None:
        self._held[key] = first
        self._expiry.append((first + self.within_ms, key, first))

    def _loaded(self) -> None:
        heapq.heapify(self._expiry)
