"""Tables and joins at run time: ``SourceTable`` (a topic materialised into a store),
``TableView`` (``filter``/``map_values`` of a table, without a store), the stream-table
joins (``StreamTableJoin``, ``KeyedLookupJoin`` for global tables), the windowed
stream-stream ``WindowedJoin`` (over ``windows.StreamJoin``) and the table-table
``TableJoin``. Stores are written as records arrive, so a join reads a table as of
each record; what a table *emits* may be held until the batch ends (``CachedTable``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Literal

from kasper_py.dsl._ops import CachedTable, NullSkips, Op, Rec, Records, TableOp
from kasper_py.dsl._times import Times, later
from kasper_py.stores.base import KeyValueStore
from kasper_py.windows import StreamJoin

JoinHow = Literal["inner", "left", "outer"]


class SourceTable(CachedTable):
    """A topic materialised into ``store``: each record upserts its key (``None``
    deletes), once per batch in the store; every record with a key is an update. With
    ``times`` (the table is joined with another table), each key's record time is
    kept there too."""

    __slots__ = ("store", "times")

    def __init__(self, store: KeyValueStore, cache: bool, times: Times | None = None) -> None:
        super().__init__(cache)
        self.store, self.times = store, times

    def push(self, records: Records) -> None:
        latest = {r[0]: r[1] for r in records if r[0] is not None}
        self.store.put_many(latest)
        if self.times is not None:
            self.times.put_many({r[0]: None if r[1] is None else r[2]
                                 for r in records if r[0] is not None})
        self.update([r for r in records if r[0] is not None])

    def lookup_many(self, keys: Iterable[Any]) -> dict[Any, Any]:
        return self.store.get_many(keys)

    def lookup_times(self, keys: Iterable[Any]) -> dict[Any, int]:
        return {} if self.times is None else self.times.get_many(keys)


class TableView(TableOp):
    """A table derived from ``parent`` without a store of its own: ``filter`` (keys
    filtered out read as absent and are emitted as deletes) or ``map_values``."""

    __slots__ = ("function", "parent", "predicate")

    def __init__(self, parent: TableOp, *, predicate: Callable[[Any, Any], bool] | None = None,
                 function: Callable[[Any], Any] | None = None) -> None:
        super().__init__()
        self.parent, self.predicate, self.function = parent, predicate, function

    def _apply(self, key: Any, value: Any) -> Any:
        if value is None:
            return None
        if self.predicate is not None and not self.predicate(key, value):
            return None
        return self.function(value) if self.function is not None else value

    def push(self, records: Records) -> None:
        self.emit([(r[0], self._apply(r[0], r[1]), r[2], r[3]) for r in records])

    def lookup_many(self, keys: Iterable[Any]) -> dict[Any, Any]:
        found = self.parent.lookup_many(keys)
        applied = {k: self._apply(k, v) for k, v in found.items()}
        return {k: v for k, v in applied.items() if v is not None}

    def lookup_times(self, keys: Iterable[Any]) -> dict[Any, int]:
        return self.parent.lookup_times(self.lookup_many(keys))


class StreamTableJoin(Op):
    """Each stream record joined with ``table``'s value of its key at that point
    (inner: dropped without one; left: joined with ``None``). Records with a ``None``
    key or value are skipped and counted (``NullSkips``), as Kafka Streams skips them."""

    __slots__ = ("joiner", "left", "skips", "table")

    def __init__(self, table: TableOp, joiner: Callable[[Any, Any], Any], left: bool,
                 skips: NullSkips) -> None:
        super().__init__()
        self.table, self.joiner, self.left, self.skips = table, joiner, left, skips

    def push(self, records: Records) -> None:
        records = self.skips.kept(records)
        found = self.table.lookup_many({r[0] for r in records})
        joiner, left, out = self.joiner, self.left, []
        for key, value, timestamp, headers in records:
            other = found.get(key)
            if other is not None or left:
                out.append((key, joiner(value, other), timestamp, headers))
        self.emit(out)


class KeyedLookupJoin(Op):
    """A stream joined with a global table, looked up by ``key_of(key, value)``. A
    record whose ``key_of`` is ``None`` joins nothing: the inner join skips it and counts
    it as a ``null_key`` skip (Kafka Streams drops it and counts it too), the left join
    emits ``joiner(value, None)``."""

    __slots__ = ("joiner", "key_of", "left", "skips", "store")

    def __init__(self, store: KeyValueStore, key_of: Callable[[Any, Any], Any],
                 joiner: Callable[[Any, Any], Any], left: bool, skips: NullSkips) -> None:
        super().__init__()
        self.store, self.key_of, self.joiner, self.left = store, key_of, joiner, left
        self.skips = skips

    def push(self, records: Records) -> None:
        records = self.skips.kept(records, key=False)  # the key_of may not need the key
        key_of = self.key_of
        lookups = [key_of(r[0], r[1]) for r in records]
        found = self.store.get_many({k for k in lookups if k is not None})
        if not self.left and None in lookups:  # nothing to join: skipped, and counted
            self.skips.counted(null_keys=lookups.count(None))
        joiner, left, out = self.joiner, self.left, []
        for r, lookup in zip(records, lookups, strict=True):
            other = found.get(lookup) if lookup is not None else None
            if other is not None or left:
                out.append((r[0], joiner(r[1], other), r[2], r[3]))
        self.emit(out)


class WindowedJoin(Op):
    """Two co-partitioned streams joined within a time window (``StreamJoin``, whose
    store holds both sides): each pair as ``joiner(value, other_value)``, stamped with
    the later of the two times; the left/outer join's unmatched records, once they can
    no longer join, with ``None`` for the missing side and their own time. Records
    with a ``None`` key or value cannot join, as in Kafka Streams: they are skipped and
    counted (``NullSkips``). ``side(0)`` and ``side(1)`` are where each stream pushes."""

    __slots__ = ("joiner", "skips", "state")

    def __init__(self, state: StreamJoin, joiner: Callable[[Any, Any], Any],
                 skips: NullSkips) -> None:
        super().__init__()
        self.state, self.joiner, self.skips = state, joiner, skips

    def side(self, index: int) -> Op:
        return _JoinSide(self, index)

    def changed(self, index: int, records: Records) -> None:
        """Stream ``index`` (0 left, 1 right) brought ``records``."""
        keyed = [(k, t, v) for k, v, t, _h in self.skips.kept(records)]
        if not keyed:
            return
        results = self.state.join(keyed, []) if index == 0 else self.state.join([], keyed)
        joiner = self.joiner
        self.emit([(r.key, joiner(r.left, r.right), r.timestamp, ()) for r in results])


class TableJoin(CachedTable):
    """Two co-partitioned tables joined by key (``how``: ``"inner"``, ``"left"`` or
    ``"outer"``): an update of either side emits the key's joined value (``None``, a
    delete, when the join has none: the inner join lacks a side, the left join its left
    side, the outer join both), unless the join had none before and has none after (see
    ``changed``). ``side(0)`` and ``side(1)`` are where each parent pushes. A result
    is stamped with the update's time or, with ``keeps_times`` (``_times``), as Kafka
    Streams stamps it: with the larger of the update's time and the other side's time
    (``lookup_times``) when the other side has a value. Held (cached) updates of a key
    keep the later stamp: the two sides are flushed one after the other, and the key
    is emitted once."""

    __slots__ = ("how", "joiner", "stamped", "tables")

    def __init__(self, tables: tuple[TableOp, TableOp], joiner: Callable[[Any, Any], Any],
                 how: JoinHow, cache: bool, keeps_times: bool = False) -> None:
        super().__init__(cache)
        self.tables, self.joiner, self.how = tables, joiner, how
        self.stamped = _later_side if keeps_times else _as_recorded
        """How an update of one side is stamped, given the other side's table and
        values: chosen once."""

    def _join(self, mine: Any, other: Any) -> Any:
        if mine is None and other is None:
            return None
        if (mine is None and self.how != "outer") or (other is None and self.how == "inner"):
            return None
        return self.joiner(mine, other)

    def side(self, index: int) -> Op:
        """The operator the table ``index`` (0 left, 1 right) pushes its updates to."""
        return _JoinSide(self, index)

    def changed(self, index: int, records: Records) -> None:
        """Table ``index`` changed: join each update with the other side's value. An
        upsert finding no value on the other side changes nothing (the join has none
        before and after) and is not emitted, except on a left join's left side and
        either side of an outer join (Kafka Streams' rule); a delete always is."""
        table = self.tables[1 - index]
        other = table.lookup_many({r[0] for r in records})
        stamped = self.stamped(table, other, records)
        if index == 1:
            joined = [(k, self._join(other.get(k), v), t, h) for k, v, t, h in stamped]
        else:
            joined = [(k, self._join(v, other.get(k)), t, h) for k, v, t, h in stamped]
        if self.how == "outer" or (index == 0 and self.how == "left"):
            self.update(joined)
        else:
            self.update([j for j, r in zip(joined, records, strict=True)
                         if r[1] is None or r[0] in other])

    def update(self, records: Records) -> None:
        held = self.held
        if self.cache and held:
            records = [_later(r, held.get(r[0])) for r in records]
        super().update(records)

    def lookup_many(self, keys: Iterable[Any]) -> dict[Any, Any]:
        wanted = set(keys)
        left = self.tables[0].lookup_many(wanted)
        right = self.tables[1].lookup_many(wanted)
        keys = {**left, **right} if self.how == "outer" else left
        joined = {k: self._join(left.get(k), right.get(k)) for k in keys}
        return {k: v for k, v in joined.items() if v is not None}

    def lookup_times(self, keys: Iterable[Any]) -> dict[Any, int]:
        """The larger of the two sides' times, for each key the join has a value of."""
        joined = self.lookup_many(keys)
        left, right = self.tables[0].lookup_times(joined), self.tables[1].lookup_times(joined)
        stamps = {k: later(left.get(k), right.get(k)) for k in joined}
        return {k: t for k, t in stamps.items() if t is not None}


def _as_recorded(_table: TableOp, _other: dict[Any, Any], records: Records) -> Records:
    """``records`` stamped with their own times."""
    return records


def _later_side(table: TableOp, other: dict[Any, Any], records: Records) -> Records:
    """``records`` stamped with the later of their times and ``table``'s times of the
    values ``other`` it has of their keys."""
    times = table.lookup_times(other) if other else {}
    if not times:
        return records
    return [(k, v, later(t, times.get(k)), h) for k, v, t, h in records]


def _later(record: Rec, held: Rec | None) -> Rec:
    """``record``, stamped with ``held``'s timestamp when that one is later."""
    if held is None or later(record[2], held[2]) == record[2]:
        return record
    return (record[0], record[1], held[2], record[3])


class _JoinSide(Op):
    __slots__ = ("index", "join")

    def __init__(self, join: TableJoin | WindowedJoin, index: int) -> None:
        super().__init__()
        self.join, self.index = join, index

    def push(self, records: Records) -> None:
        self.join.changed(self.index, records)
