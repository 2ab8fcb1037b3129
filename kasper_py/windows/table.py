"""``WindowedTable``: windowed aggregation inside ``process()``, kept in a local table
(``MemoryTable`` or ``RocksDBTable``, so a changelog restores it), and ``WindowResult``,
what it emits. Window kinds are in kinds.py, aggregations in aggregation.py.

Entries in the store (see _state.py): ``w<key><start><end>`` -> the window's aggregate
(value serde bytes); for sliding windows also ``r<key><timestamp><sequence>`` -> a
record's value, kept while a window it falls in may still be created.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable
from typing import Any, Literal, NamedTuple

from kasper_py.processor import ProcessorContext
from kasper_py.serdes import Serde, serde_for
from kasper_py.stores.query import Queryable, Scan, ScanPage
from kasper_py.windows._state import (
    TimedState,
    bad_timestamp,
    check_timestamp,
    pack_times,
    unpack,
)
from kasper_py.windows.aggregation import Aggregation
from kasper_py.windows.kinds import Hopping, Session, Sliding, Tumbling, WindowKind

__all__ = ["Emit", "WindowResult", "WindowedQueryable", "WindowedTable"]

Emit = Literal["updates", "final"]
Record = tuple[Any, int | None, Any]
"""(key, event time in ms, value): what ``WindowedTable.update`` takes."""
Window = tuple[bytes, int, int]
"""(key bytes, start, end) of one window."""
_WINDOW, _RECORD = b"w", b"r"
_GONE = object()


class WindowResult(NamedTuple):
    """One window's aggregate: the records of ``key`` with ``start <= time < end`` (ms)."""

    key: Any
    start: int
    end: int
    value: Any
    """The aggregate; ``None`` for a session merged into a larger one (``emit="updates"``:
    delete it downstream)."""


class WindowedQueryable(Queryable):
    """A ``WindowedTable``'s store as queries read it: its committed windows by key
    (``query_windows``), and its keys and aggregates through the table's serdes
    (``key_serde``, ``value_serde``). The table registers one in
    ``ProcessorContext.query_tables``; queries ask for it with ``isinstance``."""

    def __init__(self, store: Queryable, key_serde: Serde, value_serde: Serde) -> None:
        self.store, self.key_serde, self.value_serde = store, key_serde, value_serde

    def query_get_many(self, keys: Iterable[Any]) -> dict[Any, Any]:
        """The store's own query path."""
        return self.store.query_get_many(keys)

    def query_scan(self, scan: Scan) -> ScanPage:
        """The store's own query path: its entries as they are kept (see _state.py)."""
        return self.store.query_scan(scan)

    def query_windows(self, key: Any, time_from: int, time_to: int,
                      *, page: int = 1000) -> list[WindowResult]:
        """For a query from any thread: the committed windows of ``key`` overlapping
        ``[time_from, time_to]`` (ms, inclusive), earliest first. Reads the store's
        ``query_scan`` of the prefix ``w<key bytes>``, in pages of ``page``."""
        encoded = self.key_serde.encode(key)
        if encoded is None:
            raise ValueError("a window key cannot be None")
        prefix = _WINDOW + bytes(encoded)
        found, cursor = [], None
        while True:
            scanned = self.store.query_scan(Scan(prefix=prefix, cursor=cursor, limit=page))
            for entry, value in scanned.items:
                if len(entry) == len(prefix) + 16:  # not a longer key sharing this prefix
                    _, _, start, end = unpack(entry)
                    if start <= time_to and end > time_from:
                        found.append(WindowResult(key, start, end,
                                                  self.value_serde.decode(value)))
            cursor = scanned.cursor
            if cursor is None:
                return sorted(found, key=lambda result: (result.start, result.end))


class WindowedTable(TimedState):
    """Aggregates records per key and window in the local table ``store`` of the
    processor's partition.

    Call ``update(records)`` once per batch with ``(key, event time in ms, value)``
    tuples (``(m.key, ctx.event_time(m), m.value) for m in messages``) and send what it
    returns. Stream time is the largest event time seen; a record whose window closed
    (stream time reached the window's end plus grace) is dropped, logged at debug and
    counted in ``kasper_late_records_total``. ``emit="updates"`` returns each window the
    batch changed, once, with its current aggregate; ``emit="final"`` returns each
    window once, when it closes. Closed windows leave the store, so state stays bounded.

    Writes are buffered in the store and flushed by the turn, with the outputs; the
    store must be declared with ``key_serde="bytes", value_serde="bytes"`` (RocksDB),
    and the table's keys and aggregates go through ``key_serde`` and ``value_serde``.
    """

    def __init__(self, context: ProcessorContext, store: str, windows: WindowKind,
                 aggregation: Aggregation, *, emit: Emit = "updates",
                 key_serde: str | Serde = "json", value_serde: str | Serde = "json") -> None:
        if not isinstance(windows, Tumbling | Hopping | Sliding | Session):
            raise TypeError(f"windows must be Tumbling, Hopping, Sliding or Session, "
                            f"got {windows!r}")
        if emit not in ("updates", "final"):
            raise ValueError(f"emit must be 'updates' or 'final', got {emit!r}")
        if isinstance(windows, Session) and aggregation.merger is None:
            raise ValueError("session windows need an Aggregation with a merger, to combine "
                             "the sessions a record bridges")
        self.windows, self.aggregation, self.emit = windows, aggregation, emit
        self.value_serde = serde_for(value_serde)
        self._windows: dict[bytes, set[tuple[int, int]]] = {}
        self._closing: list[tuple[int, bytes, int, int]] = []
        self._retained: list[tuple[int, bytes, int, int]] = []
        self._records: dict[bytes, list[tuple[int, int]]] = {}
        self._record_expiry: list[tuple[int, bytes, int, int]] = []
        super().__init__(context, store, key_serde)
        context.query_tables[store] = WindowedQueryable(self.store, self.key_serde,
                                                        self.value_serde)

    # -- the batch --------------------------------------------------------------------

    def update(self, records: Iterable[Record]) -> list[WindowResult]:
        """Add one batch of ``(key, event time ms, value)`` records; return the results
        to emit (see ``_results`` for their order). Raises ``ValueError`` for a record
        without a non-negative int timestamp."""
        self._sync()
        changed: dict[Window, Any] = {}
        if isinstance(self.windows, Session):
            self._add_to_sessions(records, changed)
        elif isinstance(self.windows, Sliding):
            self._add_to_sliding(records, changed)
        else:
            self._add_to_fixed(records, changed)
        closed = self._close_windows()
        if self.emit == "final":
            results = self._results(self._final_values(closed, changed))
        else:
            results = self._results(changed)
        self._forget(closed)
        self._expire()
        self._end_batch()
        return results

    def advance(self, stream_time: int) -> list[WindowResult]:
        """Move stream time on to ``stream_time`` with no record and return what closing
        windows emit: call it from a stream-time timer, whose time moves on quiet input
        with ``Config.idle_advance`` (see time-and-windows.md)."""
        self._sync()
        self.stream_time = max(self.stream_time, stream_time)
        return self.update(())

    def fetch(self, key: Any, time_from: int, time_to: int) -> list[WindowResult]:
        """The windows of ``key`` still in the store that overlap ``[time_from, time_to]``
        (ms, both inclusive), with their current aggregates, earliest first."""
        self._sync()
        encoded = self._key_of(key)
        spans = sorted(span for span in self._windows.get(encoded, ())
                       if span[0] <= time_to and span[1] > time_from)
        entries = [pack_times(_WINDOW, encoded, start, end) for start, end in spans]
        found = self.store.get_many(entries)
        decode = self.value_serde.decode
        return [WindowResult(key, start, end, decode(found[entry]))
                for (start, end), entry in zip(spans, entries, strict=True) if entry in found]

    # -- tumbling and hopping ---------------------------------------------------------

    def _add_to_fixed(self, records: Iterable[Record], changed: dict[Window, Any]) -> None:
        """Group the batch's values by (key, window start), skipping closed windows, then
        fold each group into its window: one ``get_many`` and one ``put_many``."""
        kind = self.windows
        assert isinstance(kind, Tumbling | Hopping)
        size, grace, tumbling = kind.size_ms, kind.grace_ms, isinstance(kind, Tumbling)
        groups: dict[tuple[Any, int], list[Any]] = {}
        stream_time = self.stream_time
        for key, timestamp, value in records:
            if not isinstance(timestamp, int) or timestamp < 0:
                raise bad_timestamp(key, timestamp)
            if timestamp > stream_time:  # noqa: PLR1730 - max() costs twice as much here
                stream_time = timestamp
            if tumbling:  # the hot path: one window per record
                start = timestamp - timestamp % size
                if start + size + grace <= stream_time:
                    self.stream_time = stream_time
                    self._late_record(key, timestamp)
                    continue
                group = groups.get((key, start))
                if group is None:
                    groups[(key, start)] = [value]
                else:
                    group.append(value)
                continue
            dropped = False
            for start in kind.starts(timestamp):
                if start + size + grace <= stream_time:
                    dropped = True
                else:
                    groups.setdefault((key, start), []).append(value)
            if dropped:
                self.stream_time = stream_time
                self._late_record(key, timestamp)
        self.stream_time = stream_time
        self._fold_groups(groups, size, changed)

    def _fold_groups(self, groups: dict[tuple[Any, int], list[Any]], size: int,
                     changed: dict[Window, Any]) -> None:
        windows: list[tuple[bytes, bytes, int, list[Any]]] = []
        existing = []
        for (key, start), values in groups.items():
            encoded = self._key_of(key)
            entry = pack_times(_WINDOW, encoded, start, start + size)
            windows.append((entry, encoded, start, values))
            if (start, start + size) in self._windows.get(encoded, ()):
                existing.append(entry)
        stored = self.store.get_many(existing) if existing else {}
        decode, encode = self.value_serde.decode, self.value_serde.encode
        initializer, fold = self.aggregation.initializer, self.aggregation.fold
        writes = {}
        for entry, encoded, start, values in windows:
            raw = stored.get(entry)
            aggregate = fold(initializer() if raw is None else decode(raw), values)
            writes[entry] = encode(aggregate)
            changed[(encoded, start, start + size)] = aggregate
            if raw is None:
                self._add_window(encoded, start, start + size)
        self.store.put_many(writes)

    # -- sliding ----------------------------------------------------------------------

    def _add_to_sliding(self, records: Iterable[Record], changed: dict[Window, Any]) -> None:
        """Buffer each on-time record, then recompute every window holding a new record
        from the buffered records in it (in arrival order)."""
        kind = self.windows
        assert isinstance(kind, Sliding)
        grace, difference = kind.grace_ms, kind.difference_ms
        batch = [(key, check_timestamp(key, ts), value) for key, ts, value in records]
        values = self._buffered_values({self._key_of(key) for key, _, _ in batch})
        arrived: dict[bytes, list[int]] = {}
        encode = self.value_serde.encode
        writes = {}
        for key, timestamp, value in batch:
            self.stream_time = max(self.stream_time, timestamp)
            if self.stream_time >= timestamp + 1 + grace:  # its own window has closed
                self._late_record(key, timestamp)
                continue
            encoded = self._key_of(key)
            sequence = self._next_sequence()
            bisect.insort(self._records.setdefault(encoded, []), (timestamp, sequence))
            values[(encoded, timestamp, sequence)] = value
            writes[pack_times(_RECORD, encoded, timestamp, sequence)] = encode(value)
            heapq.heappush(self._record_expiry,
                           (timestamp + difference + 1 + grace, encoded, timestamp, sequence))
            arrived.setdefault(encoded, []).append(timestamp)
        self.store.put_many(writes)
        for encoded, timestamps in arrived.items():
            self._recompute_sliding(encoded, timestamps, values, changed)

    def _buffered_values(self, keys: set[bytes]) -> dict[tuple[bytes, int, int], Any]:
        """The buffered records of ``keys``: (key, timestamp, sequence) -> value."""
        entries = {pack_times(_RECORD, key, ts, seq): (key, ts, seq)
                   for key in keys for ts, seq in self._records.get(key, ())}
        found = self.store.get_many(entries) if entries else {}
        decode = self.value_serde.decode
        return {entries[entry]: decode(raw) for entry, raw in found.items()}

    def _recompute_sliding(self, encoded: bytes, arrived: list[int],
                           values: dict[tuple[bytes, int, int], Any],
                           changed: dict[Window, Any]) -> None:
        """Every window of ``encoded`` holding one of the ``arrived`` timestamps: the
        window ending at each record within ``difference`` after it, and the window
        starting just after each record within ``difference + 1`` before it (or after
        it, when records follow)."""
        assert isinstance(self.windows, Sliding)
        difference = self.windows.difference_ms
        buffered = self._records[encoded]
        times = [ts for ts, _ in buffered]
        spans: set[tuple[int, int]] = set()
        for t in arrived:
            for u in times[bisect.bisect_left(times, t):bisect.bisect_right(times, t + difference)]:
                spans.add((u - difference, u + 1))
            for u in times[bisect.bisect_left(times, t - difference - 1):
                           bisect.bisect_left(times, t)]:
                spans.add((u + 1, u + difference + 2))
            if bisect.bisect_right(times, t + difference + 1) > bisect.bisect_right(times, t):
                spans.add((t + 1, t + difference + 2))
        initializer, fold = self.aggregation.initializer, self.aggregation.fold
        writes = {}
        for start, end in spans:
            inside = sorted((seq, ts) for ts, seq in
                            buffered[bisect.bisect_left(buffered, (start, -1)):
                                     bisect.bisect_left(buffered, (end, -1))])
            aggregate = fold(initializer(), [values[(encoded, ts, seq)] for seq, ts in inside])
            writes[pack_times(_WINDOW, encoded, start, end)] = self.value_serde.encode(aggregate)
            changed[(encoded, start, end)] = aggregate
            if (start, end) not in self._windows.get(encoded, ()):
                self._add_window(encoded, start, end)
        self.store.put_many(writes)

    # -- sessions ---------------------------------------------------------------------

    def _add_to_sessions(self, records: Iterable[Record], changed: dict[Window, Any]) -> None:
        """Merge each on-time record into the sessions of its key, in arrival order, on
        an in-memory copy of the keys' sessions; then write what changed."""
        batch = [(key, check_timestamp(key, ts), value) for key, ts, value in records]
        sessions = self._load_sessions({self._key_of(key) for key, _, _ in batch})
        before = {(key, start, end) for key, spans in sessions.items() for start, end in spans}
        for key, timestamp, value in batch:
            self.stream_time = max(self.stream_time, timestamp)
            encoded = self._key_of(key)
            if not self._merge_into(encoded, sessions[encoded], timestamp, value):
                self._late_record(key, timestamp)
        after = {(key, start, end): aggregate for key, spans in sessions.items()
                 for (start, end), aggregate in spans.items()}
        gone = before - after.keys()
        self.store.delete_many([pack_times(_WINDOW, *window) for window in gone])
        for key, start, end in gone:
            self._windows[key].discard((start, end))
            changed[(key, start, end)] = None
        encode = self.value_serde.encode
        self.store.put_many({pack_times(_WINDOW, *window): encode(aggregate)
                             for window, aggregate in after.items() if aggregate is not _GONE})
        for window, aggregate in after.items():
            if aggregate is not _GONE:
                changed[window] = aggregate
                if window not in before:
                    self._add_window(*window)

    def _load_sessions(self, keys: set[bytes]) -> dict[bytes, dict[tuple[int, int], Any]]:
        """key -> (start, end) -> aggregate; unchanged sessions hold ``_GONE`` as their
        aggregate until the batch touches them (read from the store only then)."""
        return {key: dict.fromkeys(self._windows.get(key, ()), _GONE) for key in keys}

    def _merge_into(self, key: bytes, spans: dict[tuple[int, int], Any], timestamp: int,
                    value: Any) -> bool:
        """Add one record to its key's sessions; False (late) when a session of its own
        would already be closed, or a session it would join has closed (closed sessions
        stay ``gap`` longer for this)."""
        kind = self.windows
        assert isinstance(kind, Session)
        gap, grace, now = kind.gap_ms, kind.grace_ms, self.stream_time
        touching = sorted(span for span in spans
                          if span[0] - gap <= timestamp < span[1] + gap)
        start = min([timestamp, *(span[0] for span in touching)])
        end = max([timestamp + 1, *(span[1] for span in touching)])
        if (now >= timestamp + 1 + gap + grace
                or any(now >= span[1] + gap + grace for span in touching)):
            return False
        aggregates = self._session_values(key, spans, touching)
        for span in touching:
            del spans[span]
        merged = (self.aggregation.merge(aggregates) if aggregates
                  else self.aggregation.initializer())
        spans[(start, end)] = self.aggregation.aggregator(merged, value)
        return True

    def _session_values(self, key: bytes, spans: dict[tuple[int, int], Any],
                        touching: list[tuple[int, int]]) -> list[Any]:
        """The aggregates of ``touching``, read from the store where not yet in memory."""
        if not touching:
            return []
        missing = [span for span in touching if spans[span] is _GONE]
        if missing:
            entries = [pack_times(_WINDOW, key, *span) for span in missing]
            found = self.store.get_many(entries)
            for span, entry in zip(missing, entries, strict=True):
                spans[span] = self.value_serde.decode(found[entry])
        return [spans[span] for span in touching]

    # -- closing and expiry -----------------------------------------------------------

    def _close_at(self, end: int) -> int:
        """Stream time at which a window ending (exclusive) at ``end`` closes."""
        extra = self.windows.gap_ms if isinstance(self.windows, Session) else 0
        return end + extra + self.windows.grace_ms

    def _add_window(self, key: bytes, start: int, end: int) -> None:
        self._windows.setdefault(key, set()).add((start, end))
        heapq.heappush(self._closing, (self._close_at(end), key, start, end))

    def _close_windows(self) -> list[Window]:
        """Windows closed by this batch's stream time (still in the store)."""
        closed = []
        while self._closing and self._closing[0][0] <= self.stream_time:
            _, key, start, end = heapq.heappop(self._closing)
            if (start, end) in self._windows.get(key, ()):
                closed.append((key, start, end))
        return closed

    def _final_values(self, closed: list[Window], changed: dict[Window, Any]
                      ) -> dict[Window, Any]:
        """The aggregates of the closed windows (read where the batch did not change them)."""
        unread = {pack_times(_WINDOW, *window): window for window in closed
                  if window not in changed}
        found = self.store.get_many(unread) if unread else {}
        read = {unread[entry]: self.value_serde.decode(raw) for entry, raw in found.items()}
        return {window: changed[window] if window in changed else read[window]
                for window in closed if window in changed or window in read}

    def _forget(self, closed: list[Window]) -> None:
        """Closed windows leave the store; sessions stay ``gap`` longer, so a record
        that would have joined one is recognised as late."""
        if isinstance(self.windows, Session):
            gap = self.windows.gap_ms
            for key, start, end in closed:
                heapq.heappush(self._retained, (self._close_at(end) + gap, key, start, end))
            return
        self._delete_windows(closed)

    def _expire(self) -> None:
        """Drop retained sessions and buffered sliding records no window can use."""
        gone = []
        while self._retained and self._retained[0][0] <= self.stream_time:
            _, key, start, end = heapq.heappop(self._retained)
            if (start, end) in self._windows.get(key, ()):
                gone.append((key, start, end))
        self._delete_windows(gone)
        entries = []
        while self._record_expiry and self._record_expiry[0][0] <= self.stream_time:
            _, key, timestamp, sequence = heapq.heappop(self._record_expiry)
            self._records[key].remove((timestamp, sequence))
            if not self._records[key]:
                del self._records[key]
            entries.append(pack_times(_RECORD, key, timestamp, sequence))
        if entries:
            self.store.delete_many(entries)

    def _delete_windows(self, windows: list[Window]) -> None:
        if not windows:
            return
        self.store.delete_many([pack_times(_WINDOW, *window) for window in windows])
        for key, start, end in windows:
            spans = self._windows[key]
            spans.discard((start, end))
            if not spans:
                del self._windows[key]

    def _results(self, values: dict[Window, Any]) -> list[WindowResult]:
        """Final results in the order the windows closed; updates of tumbling and hopping
        windows in the order the batch first touched them (sorting thousands of them a
        batch would cost a tenth of the turn), of other windows by window, then key."""
        ordered: Iterable[tuple[Window, Any]] = values.items()
        if self.emit == "updates" and isinstance(self.windows, Session | Sliding):
            ordered = sorted(ordered, key=lambda item: (item[0][1], item[0][2], item[0][0]))
        return [WindowResult(self._decoded(key), start, end, value)
                for (key, start, end), value in ordered]

    # -- TimedState -------------------------------------------------------------------

    def _clear(self) -> None:
        self._windows.clear()
        self._closing.clear()
        self._retained.clear()
        self._records.clear()
        self._record_expiry.clear()

    def _load(self, tag: bytes, key: bytes, first: int, second: int) -> None:
        if tag == _RECORD:
            assert isinstance(self.windows, Sliding)
            self._records.setdefault(key, []).append((first, second))
            expires = first + self.windows.difference_ms + 1 + self.windows.grace_ms
            self._record_expiry.append((expires, key, first, second))
            return
        self._windows.setdefault(key, set()).add((first, second))
        close_at = self._close_at(second)
        if close_at <= self.stream_time and isinstance(self.windows, Session):
            self._retained.append((close_at + self.windows.gap_ms, key, first, second))
        else:
            self._closing.append((close_at, key, first, second))

    def _loaded(self) -> None:
        for records in self._records.values():
            records.sort()
        for heap in (self._closing, self._retained, self._record_expiry):
            heapq.heapify(heap)
