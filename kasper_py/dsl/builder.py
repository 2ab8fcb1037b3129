"""``Builder``: declare streams and tables, chain operators on them, and ``build()`` an
``App`` the loop runs like any other (every mode, exactly-once, the testing driver).

    words = Builder("wordcount", stores="memory")
    (words.stream("lines")
        .flat_map_values(str.split)
        .group_by(lambda _doc, word: word)
        .count("counts")
        .to_stream()
        .to("word-counts"))
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

from kasper_py.app import App, Repartition
from kasper_py.dsl import _aggregate as agg
from kasper_py.dsl import _fk as fk
from kasper_py.dsl import _ops as ops
from kasper_py.dsl import _tables as tables
from kasper_py.dsl._chain import Sink, Step, StepKind
from kasper_py.dsl._graph import Build, Spec, Stage, stage_factory
from kasper_py.exceptions import ConfigError
from kasper_py.stores.base import StoreSpec
from kasper_py.stores.memory import MemoryTable
from kasper_py.windows import Aggregation, WindowKind
from kasper_py.windows import count as count_aggregation

__all__ = ["Builder", "GlobalTable", "Grouped", "Stream", "Table", "WindowedGrouped"]

StoreKind = Literal["rocksdb", "memory"] | Callable[[str, bool], StoreSpec]
"""Where tables and aggregations keep their state: ``"rocksdb"`` (a changelog-backed
``RocksDBTable``, the default), ``"memory"`` (``MemoryTable``: tests), or a function of
(store name, windowed) returning a ``StoreSpec``."""
_REPARTITION = "repartition:"


def _rocksdb(name: str, windowed: bool) -> StoreSpec:
    from kasper_py.stores.rocksdb import RocksDBTable  # noqa: PLC0415 - the rocksdb extra

    if windowed:
        return RocksDBTable(name, key_serde="bytes", value_serde="bytes")
    return RocksDBTable(name, key_serde="json", value_serde="json")


def _memory(name: str, _windowed: bool) -> StoreSpec:
    return MemoryTable(name)


class Builder:
    """Declares a pipeline of streams and tables; ``build()`` makes the ``App``.

    ``cache`` (Kafka Streams' record cache): a table emits each key it changed once
    per batch, with its latest value, and an aggregation after a re-keying combines
    each batch's records per key before the repartition (count and sum always,
    ``reduce``/``aggregate`` when they can merge). ``cache=False``: one update per
    record, every record through the repartition. Operators that make a table take
    ``cache=`` too, overriding the builder's."""

    def __init__(self, name: str, *, stores: StoreKind = "rocksdb", cache: bool = True
                 ) -> None:
        self.name = name
        self.cache = cache
        self._stores: Callable[[str, bool], StoreSpec] = (
            _rocksdb if stores == "rocksdb" else _memory if stores == "memory"
            else stores)
        self._stages: list[Stage] = []
        self._repartitions: dict[str, int | None] = {}
        self._names: set[str] = set()
        self._built: App | None = None

    # -- sources -----------------------------------------------------------------------

    def stream(self, *topics: str) -> Stream:
        """The records of ``topics`` (merged), keys and values decoded by the config's
        serdes; a stage of its own until joined."""
        if not topics:
            raise ConfigError("dsl", "stream() needs at least one topic")
        stage = self._stage()
        head = _pass(stage)
        for topic in topics:
            stage.sources.setdefault(topic, []).append(head)
        return Stream(self, head, rekeyed=False)

    def table(self, topic: str, *, store: str | None = None, cache: bool | None = None
              ) -> Table:
        """``topic`` (compacted, keyed) materialised into a store named ``store``
        (``topic`` by default), queryable like any table: each record upserts its key,
        a ``None`` value deletes it; each key updated is emitted (once per batch with
        the cache, else every record)."""
        name = self._store_name(store or topic)
        stage = self._stage()
        spec_store = self._stores(name, False)
        stage.stores.append(spec_store)
        cached = self._cached(cache)
        head = Spec(lambda b: tables.SourceTable(b.context.store(name), cached), stage)
        stage.sources.setdefault(topic, []).append(head)
        return Table(self, head)

    def global_table(self, topic: str, *, store: str | None = None,
                     key_serde: str = "json", value_serde: str = "json") -> GlobalTable:
        """Every partition of ``topic`` in each process (``RocksDBTable`` with
        ``global_table``), for joins by any key (``Stream.join_global``)."""
        from kasper_py.stores.rocksdb import RocksDBTable  # noqa: PLC0415 - the rocksdb extra

        name = self._store_name(store or topic)
        return GlobalTable(RocksDBTable(name, global_table=True, changelog_topic=topic,
                                        key_serde=key_serde, value_serde=value_serde))

    # -- the app -----------------------------------------------------------------------

    def build(self) -> App:
        """The ``App``: a processor per stage, a repartition per re-keying. Building
        twice returns the same app; declaring more after that is an error."""
        if self._built is not None:
            return self._built
        app = App(self.name)
        declared = {name: app.repartition(name, partitions=count)
                    for name, count in self._repartitions.items()}
        stages = [s for s in self._stages if s.into is None]
        for stage in stages:
            inputs = [declared[s[len(_REPARTITION):]] if s.startswith(_REPARTITION) else s
                      for s in stage.sources]
            outputs: list[str | Repartition] = [*dict.fromkeys(stage.topics_out),
                       *(declared[n] for n in dict.fromkeys(stage.repartitions_out))]
            app.processor(f"stage-{stage.number}", stage_factory(
                stage.sources, _topic_of(app)), inputs=inputs, outputs=outputs,
                stores=stage.stores)
        self._built = app
        return app

    # -- for the operators -------------------------------------------------------------

    def _stage(self) -> Stage:
        if self._built is not None:
            raise ConfigError("dsl", f"builder {self.name!r} was built already")
        stage = Stage(len(self._stages))
        self._stages.append(stage)
        return stage

    def _store_name(self, name: str) -> str:
        if name in self._names:
            raise ConfigError("dsl", f"the name {name!r} is taken in builder {self.name!r}: "
                              "give the store another name")
        self._names.add(name)
        return name

    def _repartition(self, spec: Spec, name: str, partitions: int | None = None, *,
                     combine: agg.Folding | None = None) -> Spec:
        """Send ``spec``'s records through the repartition ``name`` (``combine``: folded
        per key and batch first); returns the head of the new stage reading it."""
        name = self._store_name(name)
        self._repartitions[name] = partitions
        stage = spec.stage.root()
        stage.repartitions_out.append(name)
        if combine is None:
            spec.add(Spec(None, stage, sink=Sink("repartition", name)))
        else:
            spec.add(Spec(lambda b: agg.Combine(b.stage_context, name, combine), stage))
        head = _pass(self._stage())
        head.stage.sources[_REPARTITION + name] = [head]
        return head

    def _cached(self, cache: bool | None) -> bool:
        return self.cache if cache is None else cache

    def _auto_name(self, what: str) -> str:
        number = 0
        while f"{what}-{number}" in self._names:
            number += 1
        return f"{what}-{number}"


def _pass(stage: Stage) -> Spec:
    """A head that hands its records on: a source's, a branch's, a table's stream."""
    return Spec(None, stage, step=Step("pass"))


def _topic_of(app: App) -> Callable[[str, str], str]:
    """(``Config.name`` of the running app, source name) to the topic a stage's processor
    sees. A repartition's topic is named by ``Repartition.topic`` from the name the app
    runs under (``kasper run --name``), as the loop names it, never the Builder's."""
    def topic_of(config_name: str, source: str) -> str:
        return source if not source.startswith(_REPARTITION) else (
            app.repartitions[source[len(_REPARTITION):]].topic(config_name))
    return topic_of


class Stream:
    """Records flowing through operators (Kafka Streams' KStream). Every method returns
    a new ``Stream`` (or what its name says) and runs once per batch. Not
    ``kasper_py.stream``, the Spark Structured Streaming runner."""

    def __init__(self, builder: Builder, spec: Spec, *, rekeyed: bool) -> None:
        self._builder, self._spec, self._rekeyed = builder, spec, rekeyed

    def _then(self, make: Callable[[Build], ops.Op], *, rekeyed: bool | None = None) -> Stream:
        return self._child(Spec(make, self._spec.stage.root()), rekeyed)

    def _step(self, kind: StepKind, function: Callable[..., Any], *,
              rekeyed: bool | None = None) -> Stream:
        """A stateless operator: fused with its neighbours into one pass (``_chain``)."""
        return self._child(Spec(None, self._spec.stage.root(), step=Step(kind, function)),
                           rekeyed)

    def _child(self, spec: Spec, rekeyed: bool | None) -> Stream:
        return Stream(self._builder, self._spec.add(spec),
                      rekeyed=self._rekeyed if rekeyed is None else rekeyed)

    def filter(self, predicate: Callable[[Any, Any], bool]) -> Stream:
        """The records for which ``predicate(key, value)`` is true."""
        return self._step("filter", predicate)

    def filter_not(self, predicate: Callable[[Any, Any], bool]) -> Stream:
        """The records for which ``predicate(key, value)`` is false."""
        return self._step("filter_not", predicate)

    def map(self, function: Callable[[Any, Any], tuple[Any, Any]]) -> Stream:
        """Each record as ``function(key, value)``'s (key, value); re-keys the stream."""
        return self._step("map", function, rekeyed=True)

    def map_values(self, function: Callable[[Any], Any]) -> Stream:
        """Each record's value as ``function(value)``; keys stay."""
        return self._step("map_values", function)

    def flat_map(self, function: Callable[[Any, Any], Iterable[tuple[Any, Any]]]) -> Stream:
        """Each record as the (key, value) pairs ``function(key, value)`` yields."""
        return self._step("flat_map", function, rekeyed=True)

    def flat_map_values(self, function: Callable[[Any], Iterable[Any]]) -> Stream:
        """Each record as one record per value ``function(value)`` yields, same key."""
        return self._step("flat_map_values", function)

    def select_key(self, function: Callable[[Any, Any], Any]) -> Stream:
        """Each record keyed by ``function(key, value)``."""
        return self._step("select_key", function, rekeyed=True)

    def peek(self, function: Callable[[Any, Any], object]) -> Stream:
        """Call ``function(key, value)`` on each record, which passes on unchanged."""
        return self._step("peek", function)

    def branch(self, *predicates: Callable[[Any, Any], bool]) -> list[Stream]:
        """One stream per predicate: each record goes to the first whose predicate
        holds (none: dropped). Add ``lambda k, v: True`` last for "the rest"."""
        branch = self._spec.add(Spec(lambda _b: ops.Branch(predicates),
                                     self._spec.stage.root()))
        return [Stream(self._builder, branch.add(_pass(branch.stage)), rekeyed=self._rekeyed)
                for _ in predicates]

    def merge(self, *others: Stream) -> Stream:
        """This stream's and ``others``' records as one stream (of one stage: merging
        streams of different sources joins their stages, so they must be co-partitioned
        like every input of an app)."""
        head = Spec(lambda _b: ops.Op(), self._spec.stage.root())
        for stream in (self, *others):
            head.stage = head.stage.absorb(stream._spec.stage)
            stream._spec.add(head)
        return Stream(self._builder, head,
                      rekeyed=any(s._rekeyed for s in (self, *others)))

    def to(self, topic: str) -> None:
        """Produce each record to ``topic`` (the config's serdes; its timestamp)."""
        stage = self._spec.stage.root()
        stage.topics_out.append(topic)
        self._spec.add(Spec(None, stage, sink=Sink("topic", topic)))

    def through(self, name: str, *, partitions: int | None = None) -> Stream:
        """Send the records through the app's repartition ``name`` (by their keys);
        returns the stream read from it, in a new stage."""
        head = self._builder._repartition(self._spec, name, partitions)
        return Stream(self._builder, head, rekeyed=False)

    def group_by(self, key: Callable[[Any, Any], Any], *, name: str | None = None
                 ) -> Grouped:
        """Group by ``key(key, value)``: the records go through a repartition (named
        ``name``, else after the aggregation's store) so each key's records meet."""
        return self.select_key(key).group_by_key(name=name)

    def group_by_key(self, *, name: str | None = None) -> Grouped:
        """Group by the records' keys; repartitions first when the stream was re-keyed."""
        return Grouped(self._builder, self._spec, self._rekeyed, name)

    def join(self, table: Table, joiner: Callable[[Any, Any], Any]) -> Stream:
        """Each record with a value for its key in ``table`` as ``joiner(value,
        table_value)``; the others are dropped. A re-keyed stream is repartitioned
        into the table's stage first."""
        return self._join(table, joiner, left=False)

    def left_join(self, table: Table, joiner: Callable[[Any, Any], Any]) -> Stream:
        """Each record as ``joiner(value, table_value or None)``."""
        return self._join(table, joiner, left=True)

    def _join(self, table: Table, joiner: Callable[[Any, Any], Any], left: bool) -> Stream:
        spec = self._spec
        if self._rekeyed:
            spec = self._builder._repartition(spec, self._builder._auto_name("join"))
        stage = table._spec.stage.absorb(spec.stage)
        child = spec.add(Spec(lambda b: tables.StreamTableJoin(b.table(table._spec), joiner,
                                                               left), stage))
        return Stream(self._builder, child, rekeyed=False)

    def join_global(self, table: GlobalTable, key: Callable[[Any, Any], Any],
                    joiner: Callable[[Any, Any], Any], *, left: bool = False) -> Stream:
        """Each record joined with ``table``'s value of ``key(key, value)``: no
        repartition (every process holds all of the global table)."""
        stage = self._spec.stage.root()
        if table.spec not in stage.stores:
            stage.stores.append(table.spec)
        name = table.spec.name
        return self._then(lambda b: tables.KeyedLookupJoin(b.context.store(name), key, joiner,
                                                           left))


class Grouped:
    """A stream grouped by key, ready to aggregate (Kafka Streams' KGroupedStream)."""

    def __init__(self, builder: Builder, spec: Spec, rekeyed: bool, name: str | None) -> None:
        self._builder, self._spec, self._rekeyed, self._name = builder, spec, rekeyed, name

    def _input(self, store: str, combine: agg.Folding | None) -> Spec:
        if not self._rekeyed:
            return self._spec
        return self._builder._repartition(self._spec, self._name or f"{store}-by-key",
                                          combine=combine)

    def _stateful(self, store: str, make: Callable[[Build, str], ops.Op], *,
                  windowed: bool = False, combine: agg.Folding | None = None) -> Table:
        """The table of an aggregation kept in the store ``store`` (declared on the stage
        that reads the grouped records, after a repartition when re-keyed: ``combine``d
        before it when given), whose operator ``make(build, store)`` builds."""
        name = self._builder._store_name(store)
        head = self._input(name, combine)
        stage = head.stage.root()
        stage.stores.append(self._builder._stores(name, windowed))
        return Table(self._builder, head.add(Spec(lambda b: make(b, name), stage)))

    def _folded(self, store: str, folding: agg.Folding, cache: bool | None) -> Table:
        cached = self._builder._cached(cache)
        combine = folding if cached and folding.merge is not None else None
        return self._stateful(store, lambda b, name: agg.Aggregate(
            b.context.store(name), folding, cached), combine=combine)

    def aggregate(self, initializer: Callable[[], Any], adder: Callable[[Any, Any, Any], Any],
                  store: str, *, merge: Callable[[Any, Any, Any], Any] | None = None,
                  cache: bool | None = None) -> Table:
        """Per key, ``adder(key, value, aggregate)`` from ``initializer()``, kept in the
        store ``store``. ``merge(key, aggregate, partial)``, when given, folds into
        ``aggregate`` a ``partial`` aggregated from ``initializer()`` over later
        records, giving what folding those records in one by one gives: after a
        re-keying each batch's records are then combined per key before the
        repartition (with the cache; the partial crosses it as JSON)."""
        return self._folded(store, agg.Folding(initializer, adder, merge), cache)

    def count(self, store: str, *, cache: bool | None = None) -> Table:
        """Records per key (combined before a repartition with the cache)."""
        return self._folded(store, agg.Folding.counting(), cache)

    def reduce(self, reducer: Callable[[Any, Any], Any], store: str, *,
               associative: bool = False, cache: bool | None = None) -> Table:
        """Per key, the first value, then ``reducer(aggregate, value)``. An
        ``associative`` reducer (``reducer(reducer(a, b), c) == reducer(a, reducer(b,
        c))``) is combined before a repartition, as ``aggregate`` with ``merge``."""
        return self._folded(store, agg.Folding.reducing(reducer, associative), cache)

    def sum(self, store: str, *, cache: bool | None = None) -> Table:
        """Per key, the sum of the values (numbers; combined as ``count`` is)."""
        return self.reduce(operator.add, store, associative=True, cache=cache)

    def windowed_by(self, windows: WindowKind) -> WindowedGrouped:
        """Aggregate per key and window (``Tumbling``, ``Hopping``, ``Sliding``,
        ``Session``; grace is the window's)."""
        return WindowedGrouped(self, windows)


class WindowedGrouped:
    """A grouped stream aggregated per window (``kasper_py.windows.WindowedTable``)."""

    def __init__(self, grouped: Grouped, windows: WindowKind) -> None:
        self._grouped, self._windows = grouped, windows

    def aggregate(self, aggregation: Aggregation, store: str, *,
                  emit: Literal["updates", "final"] = "updates") -> Table:
        """``aggregation`` per key and window; ``emit="final"``: each window once, when
        it closes (stream time past its end plus grace). Keys become
        ``Windowed(key, start, end)``."""
        windows = self._windows
        return self._grouped._stateful(store, lambda b, name: agg.WindowedAggregate(
            agg.windowed_table(b.context, name, windows, aggregation, emit)), windowed=True)

    def count(self, store: str, *, emit: Literal["updates", "final"] = "updates") -> Table:
        """Records per key and window."""
        return self.aggregate(count_aggregation(), store, emit=emit)

    def reduce(self, reducer: Callable[[Any, Any], Any], store: str, *,
               emit: Literal["updates", "final"] = "updates") -> Table:
        """Per key and window, values folded by ``reducer``."""
        from kasper_py.windows import reduce as reduce_aggregation  # noqa: PLC0415

        return self.aggregate(reduce_aggregation(reducer), store, emit=emit)


class Table:
    """A changelog of values per key (Kafka Streams' KTable): its records are updates,
    a ``None`` value a delete."""

    def __init__(self, builder: Builder, spec: Spec) -> None:
        self._builder, self._spec = builder, spec

    def to_stream(self) -> Stream:
        """The table's updates as a stream (deletes as ``None`` values)."""
        head = self._spec.add(_pass(self._spec.stage.root()))
        return Stream(self._builder, head, rekeyed=False)

    def filter(self, predicate: Callable[[Any, Any], bool]) -> Table:
        """The entries for which ``predicate(key, value)`` holds; an update that fails
        it is emitted as a delete."""
        parent = self._spec
        return Table(self._builder, parent.add(Spec(lambda b: tables.TableView(
            b.table(parent), predicate=predicate), parent.stage.root())))

    def map_values(self, function: Callable[[Any], Any]) -> Table:
        """Each value as ``function(value)``."""
        parent = self._spec
        return Table(self._builder, parent.add(Spec(lambda b: tables.TableView(
            b.table(parent), function=function), parent.stage.root())))

    def join(self, other: Table, joiner: Callable[[Any, Any], Any], *,
             cache: bool | None = None) -> Table:
        """Keys in both tables, valued ``joiner(value, other_value)``; an update of
        either side updates the key's joined value (or deletes it)."""
        return self._join(other, joiner, left=False, cache=cache)

    def left_join(self, other: Table, joiner: Callable[[Any, Any], Any], *,
                  cache: bool | None = None) -> Table:
        """Every key of this table, valued ``joiner(value, other_value or None)``."""
        return self._join(other, joiner, left=True, cache=cache)

    def join_foreign(self, other: Table, foreign_key: Callable[[Any], Any],
                     joiner: Callable[[Any, Any], Any], *, left: bool = False,
                     name: str | None = None, cache: bool | None = None) -> Table:
        """Each key of this table joined with ``other``'s row of ``foreign_key(value)``
        (Kafka Streams' foreign-key join, KIP-213): valued ``joiner(value,
        other_value)``; with ``left``, rows without a match are kept (``other_value``
        ``None``). Runs through two repartitions of the app (``<name>-subscription``,
        ``<name>-response``); the result is stored as ``name``."""
        builder = self._builder
        name = builder._store_name(name or builder._auto_name("fk-join"))
        mine, theirs = self._spec, other._spec
        subscription, response, state, subscribers = (builder._store_name(f"{name}-{part}")
                                                      for part in ("subscription", "response",
                                                                   "state", "subscribers"))
        builder._repartitions.update({subscription: None, response: None})
        left_stage, right_stage = mine.stage.root(), theirs.stage.root()
        left_stage.stores += [builder._stores(state, False), builder._stores(name, False)]
        right_stage.stores.append(builder._stores(subscribers, False))
        left_stage.repartitions_out.append(subscription)
        right_stage.repartitions_out.append(response)
        cached = builder._cached(cache)
        result = Spec(lambda b: fk.Result(b.context.store(name), b.table(mine), joiner, left,
                                          cached), left_stage)
        mine.add(Spec(lambda b: fk.Subscribe(b.stage_context, b.context.store(state), subscription,
                                             foreign_key, joiner, left=left), left_stage)
                 ).add(result, 1)
        answer = Spec(lambda b: fk.Answer(b.stage_context, b.context.store(subscribers),
                                          b.table(theirs), response), right_stage)
        theirs.add(answer, 1)
        for stage, repartition, target in ((right_stage, subscription, answer),
                                           (left_stage, response, result)):
            head = Spec(lambda _b: ops.Op(), stage)
            stage.sources.setdefault(_REPARTITION + repartition, []).append(head)
            head.add(target, 0)
        return Table(builder, result)

    def _join(self, other: Table, joiner: Callable[[Any, Any], Any], left: bool,
              cache: bool | None) -> Table:
        stage = self._spec.stage.absorb(other._spec.stage)
        mine, theirs = self._spec, other._spec
        cached = self._builder._cached(cache)
        spec = Spec(lambda b: tables.TableJoin((b.table(mine), b.table(theirs)), joiner, left,
                                               cached), stage)
        mine.add(spec, 0)
        theirs.add(spec, 1)
        return Table(self._builder, spec)


class GlobalTable:
    """A table every process holds in full (Kafka Streams' GlobalKTable)."""

    def __init__(self, spec: StoreSpec) -> None:
        self.spec = spec
