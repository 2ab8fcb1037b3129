"""The operators of a stage at run time, batch-first: each takes the list of records
a batch brings it and hands one list to each child, so a chain of N operators costs N
Python calls per batch plus the user's functions. A record is the tuple
``(key, value, timestamp, headers)``. Table operators also answer ``lookup_many``
(the table's current values of some keys, one store read per batch) for joins.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from kasper_py.message import Headers
from kasper_py.sender import Sender
from kasper_py.stores.base import KeyValueStore
from kasper_py.windows import Aggregation, WindowedTable, WindowKind

__all__ = ["Windowed"]

Rec = tuple[Any, Any, "int | None", Headers]
"""(key, value, timestamp ms, headers): a record between operators."""
Records = list[Rec]


class Windowed(NamedTuple):
    """The key of a windowed aggregate's record: the grouped ``key`` and its window
    ``[start, end)`` in milliseconds (Kafka Streams' ``Windowed<K>``)."""

    key: Any
    start: int
    end: int


class Turn:
    """What the operators of one partition share in a turn: its ``Sender``."""

    sender: Sender


class Op:
    """An operator: ``push`` gets a batch's records, ``emit`` hands records on."""

    __slots__ = ("children",)

    def __init__(self) -> None:
        self.children: list[Op] = []

    def push(self, records: Records) -> None:
        """Take one batch's records (never empty)."""
        self.emit(records)

    def side(self, index: int) -> Op:
        """Where input ``index`` of a two-input operator is pushed."""
        raise TypeError(f"{type(self).__name__} has one input")

    def emit(self, records: Records) -> None:
        if records:
            for child in self.children:
                child.push(records)


class OneByOne(Op):
    """Pushes a batch's records to ``op`` one at a time: before a fork whose paths meet
    again (``_graph.reconverges``), where batches would come out of order."""

    __slots__ = ("op",)

    def __init__(self, op: Op) -> None:
        super().__init__()
        self.op = op

    def push(self, records: Records) -> None:
        push = self.op.push
        for record in records:
            push([record])


class TableOp(Op):
    """An operator whose output is a table: its records are updates (``None`` value: a
    delete), and ``lookup_many`` reads its current values."""

    __slots__ = ()

    def lookup_many(self, keys: Iterable[Any]) -> dict[Any, Any]:
        """The current value of each of ``keys`` that has one."""
        raise NotImplementedError


# -- stateless -------------------------------------------------------------------------

class Filter(Op):
    __slots__ = ("keep", "predicate")

    def __init__(self, predicate: Callable[[Any, Any], bool], keep: bool = True) -> None:
        super().__init__()
        self.predicate, self.keep = predicate, keep

    def push(self, records: Records) -> None:
        predicate = self.predicate
        if self.keep:  # no bool() per record: a truth test costs nothing more
            self.emit([r for r in records if predicate(r[0], r[1])])
        else:
            self.emit([r for r in records if not predicate(r[0], r[1])])


class Map(Op):
    __slots__ = ("function",)

    def __init__(self, function: Callable[[Any, Any], tuple[Any, Any]]) -> None:
        super().__init__()
        self.function = function

    def push(self, records: Records) -> None:
        function = self.function
        self.emit([(*function(r[0], r[1]), r[2], r[3]) for r in records])


class MapValues(Op):
    __slots__ = ("function",)

    def __init__(self, function: Callable[[Any], Any]) -> None:
        super().__init__()
        self.function = function

    def push(self, records: Records) -> None:
        function = self.function
        self.emit([(r[0], function(r[1]), r[2], r[3]) for r in records])


class SelectKey(Op):
    __slots__ = ("function",)

    def __init__(self, function: Callable[[Any, Any], Any]) -> None:
        super().__init__()
        self.function = function

    def push(self, records: Records) -> None:
        function = self.function
        self.emit([(function(r[0], r[1]), r[1], r[2], r[3]) for r in records])


class FlatMap(Op):
    __slots__ = ("function",)

    def __init__(self, function: Callable[[Any, Any], Iterable[tuple[Any, Any]]]) -> None:
        super().__init__()
        self.function = function

    def push(self, records: Records) -> None:
        function = self.function
        self.emit([(k, v, r[2], r[3]) for r in records for k, v in function(r[0], r[1])])


class FlatMapValues(Op):
    __slots__ = ("function",)

    def __init__(self, function: Callable[[Any], Iterable[Any]]) -> None:
        super().__init__()
        self.function = function

    def push(self, records: Records) -> None:
        function = self.function
        self.emit([(r[0], v, r[2], r[3]) for r in records for v in function(r[1])])


class Peek(Op):
    __slots__ = ("function",)

    def __init__(self, function: Callable[[Any, Any], object]) -> None:
        super().__init__()
        self.function = function

    def push(self, records: Records) -> None:
        function = self.function
        for r in records:
            function(r[0], r[1])
        self.emit(records)


class Branch(Op):
    """Each record goes to the first branch whose predicate holds (or none)."""

    __slots__ = ("predicates",)

    def __init__(self, predicates: Sequence[Callable[[Any, Any], bool]]) -> None:
        super().__init__()
        self.predicates = list(predicates)

    def push(self, records: Records) -> None:
        buckets: list[Records] = [[] for _ in self.predicates]
        indexed = list(enumerate(self.predicates))
        for r in records:
            for index, predicate in indexed:
                if predicate(r[0], r[1]):
                    buckets[index].append(r)
                    break
        for child, bucket in zip(self.children, buckets, strict=True):
            if bucket:
                child.push(bucket)


# -- sinks -----------------------------------------------------------------------------

class ToTopic(Op):
    __slots__ = ("topic", "turn")

    def __init__(self, turn: Turn, topic: str) -> None:
        super().__init__()
        self.turn, self.topic = turn, topic

    def push(self, records: Records) -> None:
        self.turn.sender.send_many(self.topic, records)


class ToRepartition(Op):
    """Records to a repartition of the app, by key; a ``None`` key has no partition to
    go to and is dropped, as Kafka Streams drops it."""

    __slots__ = ("name", "turn")

    def __init__(self, turn: Turn, name: str) -> None:
        super().__init__()
        self.turn, self.name = turn, name

    def push(self, records: Records) -> None:
        self.turn.sender.repartition_many(self.name, [r for r in records if r[0] is not None])


# -- tables ----------------------------------------------------------------------------

class SourceTable(TableOp):
    """A topic materialised into ``store``: each record upserts its key (``None``
    deletes), once per batch in the store; every record is emitted as an update."""

    __slots__ = ("store",)

    def __init__(self, store: KeyValueStore) -> None:
        super().__init__()
        self.store = store

    def push(self, records: Records) -> None:
        latest = {r[0]: r[1] for r in records if r[0] is not None}
        self.store.put_many(latest)
        self.emit([r for r in records if r[0] is not None])

    def lookup_many(self, keys: Iterable[Any]) -> dict[Any, Any]:
        return self.store.get_many(keys)


class Aggregate(TableOp):
    """Grouped records folded per key into ``store``: read once and written once per
    batch; each record emits its key's new aggregate. ``None`` keys and values are
    skipped (Kafka Streams' rule); an aggregate of ``None`` deletes the key (emitted as
    a delete), and its next record starts again from ``initializer()``."""

    __slots__ = ("adder", "initializer", "store")

    def __init__(self, store: KeyValueStore, initializer: Callable[[], Any],
                 adder: Callable[[Any, Any, Any], Any]) -> None:
        super().__init__()
        self.store, self.initializer, self.adder = store, initializer, adder

    def push(self, records: Records) -> None:
        kept = [r for r in records if r[0] is not None and r[1] is not None]
        if not kept:
            return
        current = self.store.get_many({r[0] for r in kept})
        initializer, adder = self.initializer, self.adder
        out: Records = []
        for key, value, timestamp, headers in kept:
            aggregate = adder(key, value, current[key] if key in current else initializer())
            if aggregate is None:
                current.pop(key, None)
            else:
                current[key] = aggregate
            out.append((key, aggregate, timestamp, headers))
        self.store.put_many({r[0]: current.get(r[0]) for r in out})
        self.emit(out)

    def lookup_many(self, keys: Iterable[Any]) -> dict[Any, Any]:
        return self.store.get_many(keys)


class Reduce(Aggregate):
    """``reduce``: the first value is the aggregate, then ``reducer(aggregate, value)``."""

    __slots__ = ()

    def __init__(self, store: KeyValueStore, reducer: Callable[[Any, Any], Any]) -> None:
        first = object()

        def adder(_key: Any, value: Any, aggregate: Any) -> Any:
            return value if aggregate is first else reducer(aggregate, value)

        super().__init__(store, lambda: first, adder)


class WindowedAggregate(Op):
    """Grouped records folded per key and window in a ``WindowedTable``; emits its
    results keyed by ``Windowed(key, start, end)``, stamped with the window's end - 1
    (the last instant it covers). Records without a timestamp fail the turn."""

    __slots__ = ("table",)

    def __init__(self, table: WindowedTable) -> None:
        super().__init__()
        self.table = table

    def push(self, records: Records) -> None:
        results = self.table.update((r[0], r[2], r[1]) for r in records
                                    if r[0] is not None and r[1] is not None)
        self.emit([(Windowed(w.key, w.start, w.end), w.value, w.end - 1, ())
                   for w in results])


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


class TableJoin(TableOp):
    """Two co-partitioned tables joined by key: an update of either side emits the
    key's joined value (``None``, a delete, when the inner join has no pair, or the
    left side has none), unless the other side has no value for the key (see
    ``changed``). ``side(0)`` and ``side(1)`` are where each parent pushes."""

    __slots__ = ("joiner", "left", "tables")

    def __init__(self, tables: tuple[TableOp, TableOp], joiner: Callable[[Any, Any], Any],
                 left: bool) -> None:
        super().__init__()
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
            self.emit([(k, self._join(v, other.get(k)), t, h) for k, v, t, h in records])
        elif index == 0:
            self.emit([(k, self._join(v, other.get(k)), t, h) for k, v, t, h in records
                       if v is None or k in other])
        else:
            self.emit([(k, self._join(other.get(k), v), t, h) for k, v, t, h in records
                       if v is None or k in other])

    def lookup_many(self, keys: Iterable[Any]) -> dict[Any, Any]:
        wanted = set(keys)
        left = self.tables[0].lookup_many(wanted)
        right = self.tables[1].lookup_many(wanted)
        joined = {k: self._join(v, right.get(k)) for k, v in left.items()}
        return {k: v for k, v in joined.items() if v is not None}


class _JoinSide(Op):
    __slots__ = ("index", "join")

    def __init__(self, join: TableJoin, index: int) -> None:
        super().__init__()
        self.join, self.index = join, index

    def push(self, records: Records) -> None:
        self.join.changed(self.index, records)


def windowed_table(context: Any, store: str, windows: WindowKind, aggregation: Aggregation,
                   emit: str) -> WindowedTable:
    """The ``WindowedTable`` a windowed aggregation keeps its windows in."""
    return WindowedTable(context, store, windows, aggregation, emit=emit)  # type: ignore[arg-type]
