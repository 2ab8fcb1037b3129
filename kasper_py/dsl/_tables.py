"""Tables and joins at run time: ``SourceTable`` (a topic materialised into a store),
``TableView`` (``filter``/``map_values`` of a table, without a store), the stream-table
joins (``StreamTableJoin``, ``KeyedLookupJoin`` for global tables) and the table-table
``TableJoin``. Stores are written as records arrive, so a join reads a table as of
each record; what a table *emits* may be held until the batch ends (``CachedTable``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from kasper_py.dsl._ops import CachedTable, Op, Rec, Records, TableOp
from kasper_py.stores.base import KeyValueStore


class SourceTable(CachedTable):
    """A topic materialised into ``store``: each record upserts its key (``None``
    deletes), once per batch in the store; every record with a key is an update."""

    __slots__ = ("store",)

    def __init__(self, store: KeyValueStore, cache: bool) -> None:
        super().__init__(cache)
        self.store = store

    def push(self, records: Records) -> None:
        latest = {r[0]: r[1] for r in records if r[0] is not None}
        self.store.put_many(latest)
        self.update([r for r in records if r[0] is not None])

    def lookup_many(self, keys: Iterable[Any]) -> dict[Any, Any]:
        return self.store.get_many(keys)


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


class StreamTableJoin(Op):
    """Each stream record joined with ``table``'s value of its key at that point
    (inner: dropped without one; left: joined with ``None``)."""

    __slots__ = ("joiner", "left", "table")

    def __init__(self, table: TableOp, joiner: Callable[[Any, Any], Any], left: bool) -> None:
        super().__init__()
        self.table, self.joiner, self.left = table, joiner, left

    def push(self, records: Records) -> None:
        found = self.table.lookup_many({r[0] for r in records if r[0] is not None})
        joiner, left, out = self.joiner, self.left, []
        for key, value, timestamp, headers in records:
            if key is None or value is None:
                continue
            other = found.get(key)
            if other is not None or left:
                out.append((key, joiner(value, other), timestamp, headers))
        self.emit(out)


class KeyedLookupJoin(Op):
    """A stream joined with a global table, looked up by ``key_of(key, value)``."""

    __slots__ = ("joiner", "key_of", "left", "store")

    def __init__(self, store: KeyValueStore, key_of: Callable[[Any, Any], Any],
                 joiner: Callable[[Any, Any], Any], left: bool) -> None:
        super().__init__()
        self.store, self.key_of, self.joiner, self.left = store, key_of, joiner, left

    def push(self, records: Records) -> None:
        key_of = self.key_of
        lookups = [key_of(r[0], r[1]) if r[1] is not None else None for r in records]
        found = self.store.get_many({k for k in lookups if k is not None})
        joiner, left, out = self.joiner, self.left, []
        for r, lookup in zip(records, lookups, strict=True):
            if r[1] is None:
                continue
            other = found.get(lookup) if lookup is not None else None
            if other is not None or left:
                out.append((r[0], joiner(r[1], other), r[2], r[3]))
        self.emit(out)


class TableJoin(CachedTable):
    """Two co-partitioned tables joined by key: an update of either side emits the
    key's joined value (``None``, a delete, when the inner join has no pair, or the
    left side has none), unless the other side has no value for the key (see
    ``changed``). ``side(0)`` and ``side(1)`` are where each parent pushes. Held
    (cached) updates of a key keep the latest timestamp of either side: the two sides
    are flushed one after the other, and Kafka Streams stamps a join with the later."""

    __slots__ = ("joiner", "left", "tables")

    def __init__(self, tables: tuple[TableOp, TableOp], joiner: Callable[[Any, Any], Any],
                 left: bool, cache: bool) -> None:
        super().__init__(cache)
        self.tables, self.joiner, self.left = tables, joiner, left

    def _join(self, mine: Any, other: Any) -> Any:
        if mine is None or (other is None and not self.left):
            return None
        return self.joiner(mine, other)

    def side(self, index: int) -> Op:
        """The operator the table ``index`` (0 left, 1 right) pushes its updates to."""
        return _JoinSide(self, index)

    def changed(self, index: int, records: Records) -> None:
        """Table ``index`` changed: join each update with the other side's value. An
        upsert finding no value on the other side changes nothing (the join has none
        before and after) and is not emitted, except on a left join's left side, the
        whole left join (Kafka Streams' rule); a delete always is."""
        other = self.tables[1 - index].lookup_many({r[0] for r in records})
        if index == 0 and self.left:
            self.update([(k, self._join(v, other.get(k)), t, h) for k, v, t, h in records])
        elif index == 0:
            self.update([(k, self._join(v, other.get(k)), t, h) for k, v, t, h in records
                         if v is None or k in other])
        else:
            self.update([(k, self._join(other.get(k), v), t, h) for k, v, t, h in records
                         if v is None or k in other])

    def update(self, records: Records) -> None:
        held = self.held
        if self.cache and held:
            records = [_later(r, held.get(r[0])) for r in records]
        super().update(records)

    def lookup_many(self, keys: Iterable[Any]) -> dict[Any, Any]:
        wanted = set(keys)
        left = self.tables[0].lookup_many(wanted)
        right = self.tables[1].lookup_many(wanted)
        joined = {k: self._join(v, right.get(k)) for k, v in left.items()}
        return {k: v for k, v in joined.items() if v is not None}


def _later(record: Rec, held: Rec | None) -> Rec:
    """``record``, stamped with ``held``'s timestamp when that one is later."""
    if held is None or held[2] is None or (record[2] is not None and record[2] >= held[2]):
        return record
    return (record[0], record[1], held[2], record[3])


class _JoinSide(Op):
    __slots__ = ("index", "join")

    def __init__(self, join: TableJoin, index: int) -> None:
        super().__init__()
        self.join, self.index = join, index

    def push(self, records: Records) -> None:
        self.join.changed(self.index, records)
