"""``Builder``: declare streams and tables, chain operators on them, and ``build()`` an
``App`` the loop runs like any other (every mode, exactly-once, the testing driver).

    words = Builder("wordcount", stores="memory")
    (words.stream("lines").flat_map_values(str.split)
        .group_by(lambda _doc, word: word).count("counts").to_stream().to("word-counts"))
    app = words.build()

Each operator runs once per batch over the batch's records (a list in, a list out);
a grouped aggregation reads and writes its store once per batch. ``group_by`` (and a
join of a re-keyed stream) sends the records through a repartition of the app, which
starts the next stage: one processor of the app per stage. See docs/streams-dsl.md.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from typing import Any, Literal

from kasper_py.app import App
from kasper_py.dsl import _aggregate as agg
from kasper_py.dsl import _ops as ops
from kasper_py.dsl import _tables as tables
from kasper_py.dsl._chain import Branch, Step, StepKind
from kasper_py.dsl._graph import build_app
from kasper_py.dsl._nodes import Graph, Node
from kasper_py.dsl._stores import StoreKind, store_maker
from kasper_py.dsl._times import Timestamps, timestamps_mode
from kasper_py.exceptions import ConfigError
from kasper_py.stores.base import StoreSpec
from kasper_py.stores.ttl import Ttl
from kasper_py.windows import Aggregation, Deduplicator, JoinWindows, WindowKind
from kasper_py.windows import count as count_aggregation

__all__ = ["Builder", "GlobalTable", "Grouped", "Stream", "Table", "WindowedGrouped"]

class Builder:
    """Declares a pipeline of streams and tables; ``build()`` makes the ``App``.

    ``cache`` (Kafka Streams' record cache): a table emits each key it changed once a
    batch, with its latest value, and an aggregation after a re-keying combines each
    batch's records per key before the repartition (count and sum always, ``reduce``
    and ``aggregate`` when they can merge); ``False``: one update and one repartitioned
    record per record. An operator's own ``cache=`` overrides the builder's.

    Every operator is a node named ``name=`` or, by default, as Kafka Streams names it
    (``KSTREAM-MAPVALUES-0000000003``); ``kasper app describe`` lists them per stage,
    and a name given twice is a ``ConfigError``. ``timestamps``: how aggregations and
    table-table joins stamp outputs (``"record"``, the default, or ``"latest"``, Kafka
    Streams'). ``pack_repartitions``: ``True`` packs a turn's records of a repartition
    partition into one Kafka record, ``False`` sends one each; by default packed where a
    kasper_py older than packing would fail on a packed record, not skip it (see docs)."""

    def __init__(self, name: str, *, stores: StoreKind = "rocksdb", cache: bool = True,
                 timestamps: Timestamps = "record", pack_repartitions: bool | None = None
                 ) -> None:
        self.name = name
        self._graph = Graph(name, store_maker(stores), cache, timestamps_mode(timestamps),
                            pack_repartitions)
        self._built: App | None = None

    @property
    def cache(self) -> bool:
        """The default of operators' ``cache=``."""
        return self._graph.cache

    @cache.setter
    def cache(self, cache: bool) -> None:
        self._graph.cache = cache

    # -- sources -----------------------------------------------------------------------

    def stream(self, *topics: str, name: str | None = None) -> Stream:
        """The records of ``topics`` (merged), keys and values decoded by the config's
        serdes; a stage of its own until joined."""
        if not topics:
            raise ConfigError("dsl", "stream() needs at least one topic")
        return Stream(self._graph, self._graph.source(self._graph.stage(), topics, name=name),
                      rekeyed=False)

    def table(self, topic: str, *, store: str | None = None, cache: bool | None = None,
              name: str | None = None, ttl: float | Ttl | None = None) -> Table:
        """``topic`` (compacted, keyed) materialised into a store named ``store``
        (``topic`` by default), queryable like any table: each record upserts its key,
        a ``None`` value deletes it; each key updated is emitted (once per batch with
        the cache, else every record). ``ttl``: a key is removed that long after its last
        write (docs/stores.md, time to live)."""
        graph = self._graph
        store = graph.store_name(store or topic)
        stage = graph.stage()
        graph.store(stage, store, ttl=ttl)
        cached = graph.cached(cache)
        head = graph.source(stage, (topic,), "table", name, stores=(store,), make=lambda b: (
            tables.SourceTable(b.context.store(store), cached, graph.times(b, store))))
        return Table(graph, head, source=(store, ttl))

    def global_table(self, topic: str, *, store: str | None = None,
                     key_serde: str = "json", value_serde: str = "json") -> GlobalTable:
        """Every partition of ``topic`` in each process (``RocksDBTable`` with
        ``global_table``), for joins by any key (``Stream.join_global``)."""
        from kasper_py.stores.rocksdb import RocksDBTable  # noqa: PLC0415 - the rocksdb extra

        name = self._graph.store_name(store or topic)
        return GlobalTable(RocksDBTable(name, global_table=True, changelog_topic=topic,
                                        key_serde=key_serde, value_serde=value_serde))

    # -- the app -----------------------------------------------------------------------

    def build(self) -> App:
        """The ``App``: a processor per stage, a repartition per re-keying. Building
        twice returns the same app; declaring more after that is an error."""
        if self._built is not None:
            return self._built
        self._built = build_app(self.name, self._graph)
        self._graph.built = True
        return self._built


class Stream:
    """Records flowing through operators (Kafka Streams' KStream). Every method returns
    a new ``Stream`` (or what its name says) and runs once per batch; ``name=`` names
    its node. Not ``kasper_py.stream``, the Spark Structured Streaming runner."""

    def __init__(self, graph: Graph, node: Node, *, rekeyed: bool) -> None:
        self._graph, self._node, self._rekeyed = graph, node, rekeyed

    def _then(self, kind: str, name: str | None, *, rekeyed: bool | None = None,
              **parts: Any) -> Stream:
        return Stream(self._graph, self._graph.then(self._node, kind, name, **parts),
                      rekeyed=self._rekeyed if rekeyed is None else rekeyed)

    def _step(self, kind: StepKind, function: Callable[..., Any], name: str | None, *,
              rekeyed: bool | None = None) -> Stream:
        """A stateless operator: fused with its neighbours into one pass (``_chain``)."""
        return self._then(kind, name, rekeyed=rekeyed, step=Step(kind, function))

    def filter(self, predicate: Callable[[Any, Any], bool], *, name: str | None = None
               ) -> Stream:
        """The records for which ``predicate(key, value)`` is true."""
        return self._step("filter", predicate, name)

    def filter_not(self, predicate: Callable[[Any, Any], bool], *, name: str | None = None
                   ) -> Stream:
        """The records for which ``predicate(key, value)`` is false."""
        return self._step("filter_not", predicate, name)

    def map(self, function: Callable[[Any, Any], tuple[Any, Any]], *,
            name: str | None = None) -> Stream:
        """Each record as ``function(key, value)``'s (key, value); re-keys the stream."""
        return self._step("map", function, name, rekeyed=True)

    def map_values(self, function: Callable[[Any], Any], *, name: str | None = None
                   ) -> Stream:
        """Each record's value as ``function(value)``; keys stay."""
        return self._step("map_values", function, name)

    def flat_map(self, function: Callable[[Any, Any], Iterable[tuple[Any, Any]]], *,
                 name: str | None = None) -> Stream:
        """Each record as the (key, value) pairs ``function(key, value)`` yields."""
        return self._step("flat_map", function, name, rekeyed=True)

    def flat_map_values(self, function: Callable[[Any], Iterable[Any]], *,
                        name: str | None = None) -> Stream:
        """Each record as one record per value ``function(value)`` yields, same key."""
        return self._step("flat_map_values", function, name)

    def select_key(self, function: Callable[[Any, Any], Any], *, name: str | None = None
                   ) -> Stream:
        """Each record keyed by ``function(key, value)``."""
        return self._step("select_key", function, name, rekeyed=True)

    def peek(self, function: Callable[[Any, Any], object], *, name: str | None = None
             ) -> Stream:
        """Call ``function(key, value)`` on each record, which passes on unchanged."""
        return self._step("peek", function, name)

    def branch(self, *predicates: Callable[[Any, Any], bool], name: str | None = None
               ) -> list[Stream]:
        """One stream per predicate: each record goes to the first whose predicate
        holds (none: dropped). Add ``lambda k, v: True`` last for "the rest". With
        ``name``, the branches are named ``<name>-<index>``."""
        branch: Node = self._graph.then(self._node, "branch", name,
                                        make=lambda _b: Branch(predicates, branch.name))
        return [Stream(self._graph, self._graph.then(
            branch, "branch_child", None if name is None else f"{name}-{index}",
            step=Step("pass")), rekeyed=self._rekeyed) for index in range(len(predicates))]

    def merge(self, *others: Stream, name: str | None = None) -> Stream:
        """This stream's and ``others``' records as one stream (of one stage: merging
        streams of different sources joins their stages, so they must be co-partitioned
        like every input of an app)."""
        stage = self._graph.merge(self._node.stage, *(s._node.stage for s in others))
        head = self._graph.node("merge", stage, name, make=lambda _b: ops.Op())
        for stream in (self, *others):
            stream._node.add(head)
        return Stream(self._graph, head, rekeyed=any(s._rekeyed for s in (self, *others)))

    def drop_duplicates(self, within: float, store: str, *,
                        key: Callable[[Any, Any], Any] | None = None,
                        name: str | None = None) -> Stream:
        """Each id's first record within ``within`` seconds of event time; later ones
        are dropped (``kasper_py.windows.Deduplicator``'s rule, kept in ``store``). The
        id is ``key(key, value)``, or the record's key; a re-keyed stream is
        repartitioned first, so records of one key meet in one partition."""
        graph = self._graph
        store = graph.store_name(store)
        head = (graph.repartition(self._node, name or f"{store}-by-key") if self._rekeyed
                else self._node)
        graph.store(head.stage, store, windowed=True)
        node = graph.then(head, "drop_duplicates", name, stores=(store,), make=lambda b: (
            agg.DropDuplicates(Deduplicator(b.context, store, within=within,
                                            key_serde="json"), key)))
        return Stream(graph, node, rekeyed=False)

    def to(self, topic: str, *, name: str | None = None) -> None:
        """Produce each record to ``topic`` (the config's serdes; its timestamp)."""
        self._graph.to(self._node, topic, name)

    def through(self, name: str, *, partitions: int | None = None) -> Stream:
        """Send the records through the app's repartition ``name`` (by their keys);
        returns the stream read from it, in a new stage."""
        return Stream(self._graph, self._graph.repartition(self._node, name, partitions),
                      rekeyed=False)

    def repartition(self, *, name: str | None = None, partitions: int | None = None
                    ) -> Stream:
        """Send the records through a repartition by their keys (Kafka Streams'
        ``repartition(Repartitioned)``): named ``name``, else ``repartition-<n>``, with
        ``partitions`` of its own (else the sources' count); returns the stream read
        from it, in a new stage that runs with that count."""
        return self.through(name or self._graph.auto_name("repartition"),
                            partitions=partitions)

    def group_by(self, key: Callable[[Any, Any], Any], *, name: str | None = None,
                 partitions: int | None = None) -> Grouped:
        """Group by ``key(key, value)``: the records go through a repartition (named
        ``name``, else after the aggregation's store) so each key's records meet;
        ``partitions``: its own partition count (``Stream.repartition``)."""
        return self.select_key(key).group_by_key(name=name, partitions=partitions)

    def group_by_key(self, *, name: str | None = None, partitions: int | None = None
                     ) -> Grouped:
        """Group by the records' keys; repartitions first when the stream was re-keyed,
        or when ``partitions`` asks for a count of its own (through the repartition
        ``name``, else one named after the store)."""
        return Grouped(self._graph, self._node, self._rekeyed or partitions is not None,
                       name, partitions)

    def join(self, other: Table | Stream, joiner: Callable[[Any, Any], Any],
             windows: JoinWindows | None = None, *, store: str | None = None,
             name: str | None = None) -> Stream:
        """With a table: each record with a value for its key in ``other`` as
        ``joiner(value, table_value)``; the others are dropped. With a stream and
        ``windows``: each pair of one key's records within the windows, as
        ``joiner(value, other_value)``, both sides kept in the windowed store
        ``store``. A re-keyed stream is repartitioned first."""
        return self._join(other, joiner, "inner", windows, store, name)

    def left_join(self, other: Table | Stream, joiner: Callable[[Any, Any], Any],
                  windows: JoinWindows | None = None, *, store: str | None = None,
                  name: str | None = None) -> Stream:
        """Each record as ``joiner(value, table_value or None)``; with a stream, also
        each record that joined none as ``joiner(value, None)`` once it cannot."""
        return self._join(other, joiner, "left", windows, store, name)

    def outer_join(self, other: Stream, joiner: Callable[[Any, Any], Any],
                   windows: JoinWindows, *, store: str | None = None,
                   name: str | None = None) -> Stream:
        """A windowed left join that also sends each record of ``other`` that joined
        none, as ``joiner(None, other_value)``, once it can no longer join."""
        return self._join(other, joiner, "outer", windows, store, name)

    def _join(self, other: Table | Stream, joiner: Callable[[Any, Any], Any],  # noqa: PLR0917
              how: tables.JoinHow, windows: JoinWindows | None, store: str | None,
              name: str | None) -> Stream:
        graph, node = self._graph, self._node
        if isinstance(other, Table) and (windows or store or how == "outer"):
            raise ConfigError("dsl", "a stream-table join takes no windows or store and "
                              "has no outer form: windows are for stream-stream joins")
        if self._rekeyed:
            node = graph.repartition(node, graph.auto_name("join"))
        if isinstance(other, Stream):
            if windows is None:
                raise ConfigError("dsl", "a stream-stream join needs its windows: "
                                  "join(other, joiner, JoinWindows(seconds, grace=...))")
            theirs = other._node if not other._rekeyed else graph.repartition(
                other._node, graph.auto_name("join"))
            return Stream(graph, graph.windowed_join(node, theirs, joiner, how, windows,
                                                     store=store, name=name), rekeyed=False)
        right, left = other._node, how == "left"
        graph.merge(right.stage, node.stage)
        child = graph.then(node, "left_join" if left else "join", name, make=lambda b: (
            tables.StreamTableJoin(b.table(right), joiner, left, b.stage_context.skips)))
        return Stream(graph, child, rekeyed=False)

    def join_global(self, table: GlobalTable, key: Callable[[Any, Any], Any],
                    joiner: Callable[[Any, Any], Any], *, left: bool = False,
                    name: str | None = None) -> Stream:
        """Each record joined with ``table``'s value of ``key(key, value)``: no
        repartition (every process holds all of the global table)."""
        self._graph.keep(self._node.stage, table.spec)
        store = table.spec.name
        return self._then("left_join_global" if left else "join_global", name,
                          stores=(store,), make=lambda b: tables.KeyedLookupJoin(
                              b.context.store(store), key, joiner, left,
                              b.stage_context.skips))


class Grouped:
    """A stream grouped by key, ready to aggregate (Kafka Streams' KGroupedStream);
    ``name=`` names the aggregation's node."""

    def __init__(self, graph: Graph, node: Node, rekeyed: bool, name: str | None,
                 partitions: int | None = None) -> None:
        self._graph, self._node, self._rekeyed, self._name = graph, node, rekeyed, name
        self._partitions = partitions

    def _input(self, store: str, combine: agg.Folding | None) -> Node:
        if not self._rekeyed:
            return self._node
        return self._graph.repartition(self._node, self._name or f"{store}-by-key",
                                       self._partitions, combine=combine)

    def _stateful(self, kind: str, store: str, make: Callable[[Any, str], ops.Op],
                  name: str | None, *, windowed: bool = False,
                  combine: agg.Folding | None = None, ttl: float | Ttl | None = None) -> Table:
        """The table of an aggregation kept in the store ``store`` (declared on the stage
        that reads the grouped records, after a repartition when re-keyed: ``combine``d
        before it when given), whose operator ``make(build, store)`` builds."""
        graph = self._graph
        store = graph.store_name(store)
        head = self._input(store, combine)
        graph.store(head.stage, store, windowed, ttl)
        if not windowed:
            graph.keep_times(head.stage, (store, ttl))
        return Table(graph, graph.then(head, kind, name, stores=(store,),
                                       make=lambda b: make(b, store)))

    def _folded(self, kind: str, store: str, folding: agg.Folding, cache: bool | None,
                name: str | None, *, ttl: float | Ttl | None) -> Table:
        """An aggregation's table; ``ttl``: each key removed that long after its last
        update (docs/stores.md, time to live), as every method below takes it."""
        cached = self._graph.cached(cache)
        combine = folding if cached and folding.merge is not None else None
        return self._stateful(kind, store, lambda b, s: self._graph.aggregate(
            b, s, folding, cached), name, combine=combine, ttl=ttl)

    def aggregate(self, initializer: Callable[[], Any], adder: Callable[[Any, Any, Any], Any],
                  store: str, *, merge: Callable[[Any, Any, Any], Any] | None = None,
                  cache: bool | None = None, name: str | None = None,
                  ttl: float | Ttl | None = None) -> Table:
        """Per key, ``adder(key, value, aggregate)`` from ``initializer()``, kept in the
        store ``store``. ``merge(key, aggregate, partial)``, when given, folds into
        ``aggregate`` a ``partial`` aggregated from ``initializer()`` over later
        records, giving what folding those records in one by one gives: after a
        re-keying each batch's records are then combined per key before the
        repartition (with the cache; the partial crosses it as JSON)."""
        return self._folded("aggregate", store, agg.Folding(initializer, adder, merge),
                            cache, name, ttl=ttl)

    def count(self, store: str, *, cache: bool | None = None, name: str | None = None,
              ttl: float | Ttl | None = None) -> Table:
        """Records per key (combined before a repartition with the cache)."""
        return self._folded("count", store, agg.Folding.counting(), cache, name, ttl=ttl)

    def reduce(self, reducer: Callable[[Any, Any], Any], store: str, *,
               associative: bool = False, cache: bool | None = None,
               name: str | None = None, ttl: float | Ttl | None = None) -> Table:
        """Per key, the first value, then ``reducer(aggregate, value)``. An
        ``associative`` reducer (``reducer(reducer(a, b), c) == reducer(a, reducer(b,
        c))``) is combined before a repartition, as ``aggregate`` with ``merge``."""
        return self._folded("reduce", store, agg.Folding.reducing(reducer, associative),
                            cache, name, ttl=ttl)

    def sum(self, store: str, *, cache: bool | None = None, name: str | None = None,
            ttl: float | Ttl | None = None) -> Table:
        """Per key, the sum of the values (numbers; combined as ``count`` is)."""
        return self._folded("sum", store, agg.Folding.reducing(operator.add, True), cache,
                            name, ttl=ttl)

    def windowed_by(self, windows: WindowKind) -> WindowedGrouped:
        """Aggregate per key and window (``Tumbling``, ``Hopping``, ``Sliding``,
        ``Session``; grace is the window's)."""
        return WindowedGrouped(self, windows)


class WindowedGrouped:
    """A grouped stream aggregated per window (``kasper_py.windows.WindowedTable``)."""

    def __init__(self, grouped: Grouped, windows: WindowKind) -> None:
        self._grouped, self._windows = grouped, windows

    def aggregate(self, aggregation: Aggregation, store: str, *,
                  emit: Literal["updates", "final"] = "updates", name: str | None = None
                  ) -> Table:
        """``aggregation`` per key and window; ``emit="final"``: each window once, when
        it closes (stream time past its end plus grace). Keys become
        ``Windowed(key, start, end)``."""
        windows = self._windows
        return self._grouped._stateful(
            "windowed_aggregate", store, lambda b, s: agg.windowed_aggregate(
                b.context, b.stage_context, store=s, windows=windows,
                aggregation=aggregation, emit=emit),
            name, windowed=True)

    def count(self, store: str, *, emit: Literal["updates", "final"] = "updates",
              name: str | None = None) -> Table:
        """Records per key and window."""
        return self.aggregate(count_aggregation(), store, emit=emit, name=name)

    def reduce(self, reducer: Callable[[Any, Any], Any], store: str, *,
               emit: Literal["updates", "final"] = "updates", name: str | None = None
               ) -> Table:
        """Per key and window, values folded by ``reducer``."""
        from kasper_py.windows import reduce as reduce_aggregation  # noqa: PLC0415

        return self.aggregate(reduce_aggregation(reducer), store, emit=emit, name=name)


class Table:
    """A changelog of values per key (Kafka Streams' KTable): its records are updates,
    a ``None`` value a delete. ``name=`` names an operator's node."""

    def __init__(self, graph: Graph, node: Node, *,
                 source: tuple[str, float | Ttl | None] | None = None) -> None:
        self._graph, self._node = graph, node
        self._source = source
        """The store and ttl of a table keeping its times once joined with another
        table (a source table, a foreign-key join's result, a view of either)."""

    def to_stream(self, *, name: str | None = None) -> Stream:
        """The table's updates as a stream (deletes as ``None`` values)."""
        head = self._graph.then(self._node, "to_stream", name, step=Step("pass"))
        return Stream(self._graph, head, rekeyed=False)

    def filter(self, predicate: Callable[[Any, Any], bool], *, name: str | None = None
               ) -> Table:
        """The entries for which ``predicate(key, value)`` holds; an update that fails
        it is emitted as a delete."""
        parent = self._node
        return Table(self._graph, self._graph.then(parent, "table_filter", name, make=lambda b: (
            tables.TableView(b.table(parent), predicate=predicate))), source=self._source)

    def map_values(self, function: Callable[[Any], Any], *, name: str | None = None
                   ) -> Table:
        """Each value as ``function(value)``."""
        parent = self._node
        return Table(self._graph, self._graph.then(
            parent, "table_map_values", name, make=lambda b: tables.TableView(
                b.table(parent), function=function)), source=self._source)

    def join(self, other: Table, joiner: Callable[[Any, Any], Any], *,
             cache: bool | None = None, name: str | None = None) -> Table:
        """Keys in both tables, valued ``joiner(value, other_value)``; an update of
        either side updates the key's joined value (or deletes it)."""
        return self._join(other, joiner, "inner", cache, name)

    def left_join(self, other: Table, joiner: Callable[[Any, Any], Any], *,
                  cache: bool | None = None, name: str | None = None) -> Table:
        """Every key of this table, valued ``joiner(value, other_value or None)``."""
        return self._join(other, joiner, "left", cache, name)

    def outer_join(self, other: Table, joiner: Callable[[Any, Any], Any], *,
                   cache: bool | None = None, name: str | None = None) -> Table:
        """Every key of either table, valued ``joiner(value or None, other_value or
        None)``; a key leaves the join once neither table has it."""
        return self._join(other, joiner, "outer", cache, name)

    def join_foreign(self, other: Table, foreign_key: Callable[[Any], Any],
                     joiner: Callable[[Any, Any], Any], *, left: bool = False,
                     name: str | None = None, cache: bool | None = None) -> Table:
        """Each key of this table joined with ``other``'s row of ``foreign_key(value)``
        (Kafka Streams' foreign-key join, KIP-213): valued ``joiner(value,
        other_value)``; with ``left``, rows without a match are kept (``other_value``
        ``None``). Runs through two repartitions of the app (``<name>-subscription``,
        ``<name>-response``); the result is stored as ``name``, which names its node
        too."""
        result = self._graph.foreign_key_join(
            self._node, other._node, foreign_key, joiner, left=left, store=name, cache=cache,
            name=name)
        return Table(self._graph, result, source=(result.stores[0], None))

    def _join(self, other: Table, joiner: Callable[[Any, Any], Any], how: tables.JoinHow,
              cache: bool | None, name: str | None) -> Table:
        graph, mine, theirs = self._graph, self._node, other._node
        graph.keep_times(graph.merge(mine.stage, theirs.stage), self._source, other._source)
        cached = graph.cached(cache)
        kind = "table_join" if how == "inner" else f"table_{how}_join"
        joined = graph.then(mine, kind, name, port=0, make=lambda b: tables.TableJoin(
            (b.table(mine), b.table(theirs)), joiner, how, cached, graph.keeps_times))
        theirs.add(joined, 1)
        return Table(graph, joined)


class GlobalTable:
    """A table every process holds in full (Kafka Streams' GlobalKTable)."""

    def __init__(self, spec: StoreSpec) -> None:
        self.spec = spec
