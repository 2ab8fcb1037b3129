"""Grouped aggregations at run time: ``Aggregate`` (count, reduce, aggregate, sum) and
``WindowedAggregate`` fold records into a store once per batch; ``Combine`` folds a
batch's records per key *before* a repartition, so one record per key and batch
crosses it, and the aggregation downstream merges these partials.

A combined record of a repartition has a ``None`` value and, as its last header,
``kasper.partial``: the partial aggregate as JSON (a count as its digits). Its other
headers and its timestamp are those of the key's latest record in the batch. A record
without that header is a plain one, folded as it is: a repartition may hold both
(written before and after combining was turned on, or a record that reset its key).
"""

from __future__ import annotations

import math
import operator
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kasper_py.dsl._ops import CachedTable, NullSkips, Op, Records, StageContext, Windowed
from kasper_py.exceptions import SerdeError
from kasper_py.message import Headers
from kasper_py.processor import ProcessorContext
from kasper_py.sender import Sender, SendRecord
from kasper_py.serdes import JSON
from kasper_py.stores.base import KeyValueStore
from kasper_py.windows import (
    Aggregation,
    Deduplicator,
    Hopping,
    Tumbling,
    WindowedTable,
    WindowKind,
    WindowResult,
)

PARTIAL = "kasper.partial"
"""The header of a combined record (reserved: a record of yours must not end with it)."""
_FIRST = object()
"""A reduce's aggregate before its first value."""
_KEY, _VALUE = operator.itemgetter(0), operator.itemgetter(1)
_TIME_OF = operator.itemgetter(2)
_TICK_MS = 1000
"""The least stream time between a windowed aggregation's idle ticks: finer ones would
wake a quiet loop for every millisecond of event time."""

Merge = Callable[[Any, Any, Any], Any]
"""``merge(key, aggregate, partial)``: the aggregate with a partial's records folded in."""


@dataclass(frozen=True)
class Folding:
    """How an aggregation folds a key's records: ``adder(key, value, aggregate)`` from
    ``initializer()``; with ``merge``, partials of a batch's records can be combined
    before a repartition (``counts``: a count, combined with ``Counter``)."""

    initializer: Callable[[], Any]
    adder: Callable[[Any, Any, Any], Any]
    merge: Merge | None = None
    counts: bool = False

    @classmethod
    def counting(cls) -> Folding:
        return cls(int, lambda _k, _v, n: n + 1, lambda _k, n, partial: n + partial, True)

    @classmethod
    def reducing(cls, reducer: Callable[[Any, Any], Any], associative: bool) -> Folding:
        """``reduce``: the first value is the aggregate, then ``reducer(aggregate,
        value)``; an associative reducer merges partials the same way."""
        def adder(_key: Any, value: Any, aggregate: Any) -> Any:
            return value if aggregate is _FIRST else reducer(aggregate, value)

        def merge(_key: Any, aggregate: Any, partial: Any) -> Any:
            return reducer(aggregate, partial)

        return cls(lambda: _FIRST, adder, merge if associative else None)


class Aggregate(CachedTable):
    """Grouped records folded per key into ``store``: read once and written once per
    batch; each record updates its key's aggregate (emitted once per batch with the
    cache). ``None`` keys and values are skipped and counted (``NullSkips``, Kafka
    Streams' rule); an aggregate
    of ``None`` deletes the key (emitted as a delete), and its next record starts again
    from ``initializer()``. A combined record merges its partial in."""

    __slots__ = ("folding", "skips", "store")

    def __init__(self, store: KeyValueStore, folding: Folding, cache: bool,
                 skips: NullSkips) -> None:
        super().__init__(cache)
        self.store, self.folding, self.skips = store, folding, skips

    def push(self, records: Records) -> None:
        kept = self.skips.kept(records, partial=PARTIAL)
        if self.folding.counts and self.cache:
            self._count(kept)
            return
        if kept:
            self._fold_batch(kept)

    def _fold_batch(self, kept: Records) -> None:
        """``kept`` folded into the store, read once and written once."""
        current = self.store.get_many({r[0] for r in kept})
        out = self._fold(kept, current)
        self.store.put_many({r[0]: current.get(r[0]) for r in out})
        self.update(out)

    def _fold(self, kept: Records, current: dict[Any, Any]) -> Records:
        """Each record folded into ``current`` in turn; the updates, in order."""
        initializer, adder, decode = self.folding.initializer, self.folding.adder, JSON.decode
        out: Records = []
        for key, value, timestamp, headers in kept:
            if headers and headers[-1][0] == PARTIAL:
                aggregate = self._merge(key, current, decode(headers[-1][1]))
                out.append((key, aggregate, timestamp, headers[:-1]))
            else:
                aggregate = adder(key, value, current[key] if key in current else initializer())
                out.append((key, aggregate, timestamp, headers))
            if aggregate is None:
                current.pop(key, None)
            else:
                current[key] = aggregate
        return out

    def _count(self, records: Records) -> None:
        """A count with the cache: only each key's total matters, so records are
        counted per key (in C when none is combined or skipped), then added."""
        keys, counts = key_counts(records)
        if not counts:
            return
        totals = self.store.get_many(counts.keys())
        for key, n in counts.items():
            totals[key] = totals.get(key, 0) + n
        self.store.put_many(totals)
        latest = dict(zip(keys, records, strict=True))
        self.update([(key, totals[key], latest[key][2], own_headers(latest[key][3]))
                     for key in reversed(dict.fromkeys(reversed(keys))) if key in counts])

    def _merge(self, key: Any, current: dict[Any, Any], partial: Any) -> Any:
        """``partial`` merged into ``key``'s aggregate in ``current`` (or the aggregate)."""
        if key not in current:
            return partial
        merge = self.folding.merge
        if merge is None:
            raise SerdeError(f"a combined record (header {PARTIAL!r}) of key {key!r} reached "
                             "an aggregation that cannot merge one: give it back its "
                             "merge function (or associative=True) until the repartition "
                             "holds no more of them")
        return merge(key, current[key], partial)

    def lookup_many(self, keys: Iterable[Any]) -> dict[Any, Any]:
        return self.store.get_many(keys)


def key_counts(records: Records) -> tuple[list[Any], dict[Any, int]]:
    """The key of each of ``records``, and how many records each key counts (in C when
    none is combined or skipped)."""
    keys = list(map(_KEY, records))
    if None not in map(_VALUE, records):
        return keys, Counter(keys)
    counts: dict[Any, int] = {}  # combined records (the skipped are gone)
    for key, value, _, headers in records:
        counts[key] = counts.get(key, 0) + (
            1 if value is not None else int(headers[-1][1] or b"0"))
    return keys, counts


def own_headers(headers: Headers) -> Headers:
    """A record's headers without the combined record's header."""
    return headers[:-1] if headers and headers[-1][0] == PARTIAL else headers


class Combine(Op):
    """The records of an aggregation, before its repartition ``name``: each key's
    records of the batch folded into one partial, sent as one combined record. A
    record whose fold gives ``None`` (a reset, which may depend on the aggregate it
    resets) is not combined: the key's partial so far is sent, then the record as it
    is, and a new partial starts after it. ``None`` keys (no partition to go to) and
    ``None`` values (skipped by aggregations) are skipped and counted here."""

    __slots__ = ("folding", "name", "stage")

    def __init__(self, stage: StageContext, name: str, folding: Folding) -> None:
        super().__init__()
        self.stage, self.name, self.folding = stage, name, folding

    @staticmethod
    def stamp(held: int | None, timestamp: int | None) -> int | None:
        """The time of a partial holding a key's records up to one of ``timestamp``
        (``held``: the partial's before): the latest record's."""
        return timestamp

    def push(self, records: Records) -> None:
        records = self.stage.skips.kept(records)
        if self.folding.counts:
            combined = self._count(records)
        else:
            combined = []
            partials = self._fold(records, combined)
            combined += [self._combined(key, partial) for key, partial in partials.items()]
        if combined:  # the batch's records for the repartition, in order, in one call
            self.stage.repartition(self.name, combined)

    def _count(self, records: Records) -> list[SendRecord]:
        """A count's partials: C loops over the records, a Python one over the keys."""
        keys = list(map(_KEY, records))
        latest = dict(zip(keys, records, strict=True))
        combined: list[SendRecord] = []
        for key, n in Counter(keys).items():
            _, _, timestamp, headers = latest[key]
            combined.append((key, None, timestamp, (*headers, (PARTIAL, b"%d" % n))))
        return combined

    def _fold(self, records: Records, combined: list[SendRecord]
              ) -> dict[Any, tuple[Any, int | None, Headers]]:
        """Each key's partial of ``records``; a reset record, and the partial of its key
        before it, go to ``combined`` at once."""
        initializer, adder = self.folding.initializer, self.folding.adder
        partials: dict[Any, tuple[Any, int | None, Headers]] = {}
        for key, value, timestamp, headers in records:
            held = partials.get(key)
            aggregate = adder(key, value, held[0] if held is not None else initializer())
            if aggregate is not None:
                partials[key] = (aggregate, timestamp if held is None
                                 else self.stamp(held[1], timestamp), headers)
                continue
            if held is not None:
                del partials[key]
                combined.append(self._combined(key, held))
            combined.append((key, value, timestamp, headers))
        return partials

    def _combined(self, key: Any, partial: tuple[Any, int | None, Headers]) -> SendRecord:
        """The combined record of ``key``'s ``partial``, as ``Sender.repartition_many``
        takes it."""
        aggregate, timestamp, headers = partial
        try:
            wired = JSON.encode(aggregate)
        except SerdeError as exc:
            raise SerdeError(f"repartition {self.name!r}: the partial aggregate of key "
                             f"{key!r} crosses it as JSON, and {exc}; aggregate to JSON "
                             "values, or turn combining off (cache=False)") from exc
        return key, None, timestamp, (*headers, (PARTIAL, wired))


class WindowedAggregate(Op):
    """Grouped records folded per key and window in a ``WindowedTable``; emits its
    results keyed by ``Windowed(key, start, end)``, stamped with the window's end - 1
    (the last instant it covers), once per window a batch changed. Records without a
    timestamp fail the turn. Never combined before a repartition: which window a
    record lands in, and whether it is late, depend on the stream time of the stage
    that counts it. Records with a ``None`` key or value are skipped and counted
    (``NullSkips``). With ``Config.idle_advance``, a stream-time timer (``tick``) moves
    the table's stream time with the partition's, so windows close on quiet input."""

    __slots__ = ("stage", "table")

    def __init__(self, table: WindowedTable, stage: StageContext) -> None:
        super().__init__()
        self.table, self.stage = table, stage

    def push(self, records: Records) -> None:
        self._emit(self.table.update((r[0], r[2], r[1])
                                     for r in self.stage.skips.kept(records)))

    def tick(self, stream_time: int, sender: Sender) -> None:
        """A stream-time timer: the windows that close by ``stream_time`` emit, and the
        updates tables downstream hold go on, as at the end of a batch."""
        self.stage.sender = sender
        self.stage.start()
        self._emit(self.table.advance(stream_time))
        self.stage.end()

    def _emit(self, results: list[WindowResult]) -> None:
        self.emit([(Windowed(w.key, w.start, w.end), w.value, w.end - 1, ())
                   for w in results])


def windowed_aggregate(context: ProcessorContext, stage: StageContext, *, store: str,
                       windows: WindowKind, aggregation: Aggregation,
                       emit: str) -> WindowedAggregate:
    """The operator of a windowed aggregation, its windows in a ``WindowedTable``; with
    ``Config.idle_advance`` it ticks every ``close_step(windows)`` of stream time."""
    table = WindowedTable(context, store, windows, aggregation, emit=emit)  # type: ignore[arg-type]
    op = WindowedAggregate(table, stage)
    if context.config.idle_advance is not None:
        context.schedule(close_step(windows) / 1000, op.tick)
    return op


def close_step(windows: WindowKind) -> int:
    """Milliseconds of stream time between a windowed aggregation's ticks: the step
    every window of a tumbling or hopping kind closes on (the gcd of its advance and its
    size plus grace), at least 1 s; 1 s for sliding and session windows, whose windows
    close at any millisecond. A window closes at the first tick at or after its close."""
    if isinstance(windows, Tumbling | Hopping):
        advance = windows.advance_ms if isinstance(windows, Hopping) else windows.size_ms
        step = math.gcd(advance, windows.size_ms + windows.grace_ms)
        return step if step >= _TICK_MS else _TICK_MS
    return _TICK_MS


class DropDuplicates(Op):
    """Records whose id (``id_of(key, value)``, or the key) is its first occurrence
    within the ``Deduplicator``'s window of event time; the others are dropped. Records
    without a timestamp fail the turn."""

    __slots__ = ("dedup", "id_of")

    def __init__(self, dedup: Deduplicator, id_of: Callable[[Any, Any], Any] | None) -> None:
        super().__init__()
        self.dedup = dedup
        self.id_of = id_of

    def push(self, records: Records) -> None:
        id_of = self.id_of
        ids = _KEY if id_of is None else (lambda r: id_of(r[0], r[1]))
        self.emit(self.dedup.first_occurrences(records, ids, _TIME_OF))
