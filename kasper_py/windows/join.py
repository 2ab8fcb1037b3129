"""``StreamJoin``: a windowed join of two co-partitioned streams inside ``process()``,
inner, left or outer, with both sides buffered in a local table until no record can join them
any more; and ``JoinResult``, what it emits.

Entries in the store (see _state.py): ``a<key><timestamp><sequence>`` (left) and
``b<key><timestamp><sequence>`` (right) -> a flag byte (1: matched, 2: value is None)
and the value's serde bytes.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable
from typing import Any, Literal, NamedTuple

from kasper_py.processor import ProcessorContext
from kasper_py.serdes import Serde, serde_for
from kasper_py.windows._state import TimedState, check_timestamp, pack_times
from kasper_py.windows.kinds import Duration, to_millis

__all__ = ["JoinResult", "StreamJoin"]

_LEFT, _RIGHT = b"a", b"b"
_MATCHED, _NONE = 1, 2
Record = tuple[Any, int | None, Any]
Buffered = tuple[bytes, bytes, int, int]
"""(side, key bytes, timestamp, sequence) of one buffered record."""


class JoinResult(NamedTuple):
    """One joined pair of records of ``key``."""

    key: Any
    left: Any
    right: Any
    """``None`` for a left record no right record joined (``how="left"``/``"outer"``)."""
    timestamp: int
    """The later of the two event times (the record's own when unmatched)."""


class StreamJoin(TimedState):
    """Joins the records of two co-partitioned topics whose keys are equal and whose
    event times are close, in the local table ``store`` (declared with
    ``key_serde="bytes", value_serde="bytes"``): a left record at ``t`` joins the right
    records from ``t - before`` to ``t + after`` (Kafka Streams' ``JoinWindows``;
    ``within`` sets both). Seconds, or ``timedelta``s.

    Call ``join(left, right)`` once per batch with each side's ``(key, event time ms,
    value)`` records; a batch's records are taken in event-time order, as Kafka Streams
    takes the earliest record of its inputs first. Each pair is returned when its second
    record arrives. A record is late, dropped and counted in ``kasper_late_records_total``,
    when stream time is past the end of its window plus ``grace`` (``t + after + grace``
    for a left record, ``t + before + grace`` for a right one). A buffered record leaves
    the store once no on-time record can join it (stream time past ``t + before + after
    + grace``); then, with ``how="left"`` or ``"outer"``, a left record that never joined
    is returned with ``right=None``, and with ``"outer"`` a right record that never
    joined with ``left=None``. So an unmatched result is never followed by a match.
    """

    def __init__(self, context: ProcessorContext, store: str, *,
                 within: Duration | None = None, before: Duration | None = None,
                 after: Duration | None = None, grace: Duration = 0,
                 how: Literal["inner", "left", "outer"] = "inner",
                 key_serde: str | Serde = "json", value_serde: str | Serde = "json") -> None:
        if how not in ("inner", "left", "outer"):
            raise ValueError(f"how must be 'inner', 'left' or 'outer', got {how!r}")
        before, after = within if before is None else before, within if after is None else after
        if before is None or after is None:
            raise ValueError("a stream join needs its time difference: within=, or both "
                             "before= and after=")
        self.before_ms = to_millis("join time difference (before)", before, positive=False)
        self.after_ms = to_millis("join time difference (after)", after, positive=False)
        self.grace_ms = to_millis("grace", grace, positive=False)
        self.how = how
        self._unmatched = {_LEFT: how != "inner", _RIGHT: how == "outer"}
        """Whether a side's records that never joined are returned when they expire."""
        self.value_serde = serde_for(value_serde)
        self._buffers: dict[bytes, dict[bytes, list[tuple[int, int]]]] = {_LEFT: {}, _RIGHT: {}}
        self._expiry: list[tuple[int, bytes, bytes, int, int]] = []
        super().__init__(context, store, key_serde)

    def join(self, left: Iterable[Record], right: Iterable[Record]) -> list[JoinResult]:
        """Add one batch of each side's records; return the joined pairs, then (left
        join) the left records that can no longer join, oldest first."""
        self._sync()
        records = [(_LEFT, key, check_timestamp(key, ts), value) for key, ts, value in left]
        records += [(_RIGHT, key, check_timestamp(key, ts), value) for key, ts, value in right]
        records.sort(key=lambda record: record[2])  # stable: a side's order is kept
        values = self._buffered({self._key_of(key) for _, key, _, _ in records})
        results: list[JoinResult] = []
        writes: dict[bytes, bytes] = {}
        for side, key, timestamp, value in records:
            self.stream_time = max(self.stream_time, timestamp)
            closes = self.after_ms if side == _LEFT else self.before_ms
            if self.stream_time > timestamp + closes + self.grace_ms:
                self._late_record(key, timestamp)
                continue
            self._add(side, key, timestamp, value, values, results, writes)
        self.store.put_many(writes)
        results += self._expire(values)
        self._end_batch()
        return results

    def _add(self, side: bytes, key: Any, timestamp: int, value: Any,  # noqa: PLR0917
             values: dict[Buffered, tuple[bool, Any]], results: list[JoinResult],
             writes: dict[bytes, bytes]) -> None:
        """Join one on-time record with the other side's buffered records, then buffer it."""
        encoded = self._key_of(key)
        other = _RIGHT if side == _LEFT else _LEFT
        buffered = self._buffers[other].get(encoded, [])
        earlier, later = ((self.before_ms, self.after_ms) if side == _LEFT
                          else (self.after_ms, self.before_ms))
        low = bisect.bisect_left(buffered, (timestamp - earlier, -1))
        high = bisect.bisect_left(buffered, (timestamp + later + 1, -1))
        for their_time, their_sequence in buffered[low:high]:
            theirs = (other, encoded, their_time, their_sequence)
            matched, their_value = values[theirs]
            at = max(timestamp, their_time)
            if side == _LEFT:
                results.append(JoinResult(key, value, their_value, at))
            else:
                results.append(JoinResult(key, their_value, value, at))
            if not matched and self._unmatched[other]:  # joined at last: not sent unmatched
                values[theirs] = (True, their_value)
                writes[pack_times(*theirs)] = self._encode(True, their_value)
        sequence = self._next_sequence()
        mine = (side, encoded, timestamp, sequence)
        bisect.insort(self._buffers[side].setdefault(encoded, []), (timestamp, sequence))
        values[mine] = (high > low, value)
        writes[pack_times(side, encoded, timestamp, sequence)] = self._encode(high > low, value)
        heapq.heappush(self._expiry, (self._expires_at(timestamp), *mine))

    def _expires_at(self, timestamp: int) -> int:
        return timestamp + self.before_ms + self.after_ms + self.grace_ms + 1

    def _buffered(self, keys: set[bytes]) -> dict[Buffered, tuple[bool, Any]]:
        """Both sides' buffered records of ``keys``: (matched, value) each."""
        wanted = {pack_times(side, key, ts, seq): (side, key, ts, seq)
                  for side, buffers in self._buffers.items() for key in keys
                  for ts, seq in buffers.get(key, ())}
        found = self.store.get_many(wanted) if wanted else {}
        return {wanted[entry]: self._decode(raw) for entry, raw in found.items()}

    def _expire(self, values: dict[Buffered, tuple[bool, Any]]) -> list[JoinResult]:
        """Drop the records no on-time record can join; return the unmatched ones of
        the sides that send them (left: the left side; outer: both), oldest first."""
        gone: list[Buffered] = []
        while self._expiry and self._expiry[0][0] <= self.stream_time:
            _, side, key, timestamp, sequence = heapq.heappop(self._expiry)
            spans = self._buffers[side][key]
            spans.remove((timestamp, sequence))
            if not spans:
                del self._buffers[side][key]
            gone.append((side, key, timestamp, sequence))
        if not gone:
            return []
        entries = {pack_times(*record): record for record in gone}
        unread = [entry for entry, record in entries.items()
                  if self._unmatched[record[0]] and record not in values]
        found = self.store.get_many(unread) if unread else {}
        values = {**values, **{entries[e]: self._decode(raw) for e, raw in found.items()}}
        results = []
        for record in gone:
            if not self._unmatched[record[0]]:
                continue
            matched, value = values[record]
            if not matched:
                key = self._decoded(record[1])
                results.append(JoinResult(key, value, None, record[2]) if record[0] == _LEFT
                               else JoinResult(key, None, value, record[2]))
        self.store.delete_many(list(entries))
        return results

    def _encode(self, matched: bool, value: Any) -> bytes:
        raw = self.value_serde.encode(value)
        flags = (_MATCHED if matched else 0) | (_NONE if raw is None else 0)
        return bytes([flags]) + (raw or b"")

    def _decode(self, raw: bytes) -> tuple[bool, Any]:
        flags = raw[0]
        value = None if flags & _NONE else self.value_serde.decode(raw[1:])
        return bool(flags & _MATCHED), value

    # -- TimedState -------------------------------------------------------------------

    def _clear(self) -> None:
        for buffers in self._buffers.values():
            buffers.clear()
        self._expiry.clear()

    def _load(self, tag: bytes, key: bytes, first: int, second: int) -> None:
        self._buffers[tag].setdefault(key, []).append((first, second))
        self._expiry.append((self._expires_at(first), tag, key, first, second))

    def _loaded(self) -> None:
        for buffers in self._buffers.values():
            for records in buffers.values():
                records.sort()
        heapq.heapify(self._expiry)
