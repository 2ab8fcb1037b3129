"""The declared graph of a DSL pipeline: named operator nodes in explicit stages. A
stage is the part of the graph one processor of the app runs (Kafka Streams'
sub-topology): what reads its topics and repartitions, down to the next repartition.
Joining two things of different stages that are partitioned alike merges the stages
(``Graph.merge`` moves the nodes, so no node points to a stage that is gone); a
re-keyed stream reaches another stage through a repartition. ``_graph`` builds and
runs a stage's operators from its nodes; ``builder`` is the user's side.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from kasper_py.dsl import _aggregate as agg
from kasper_py.dsl import _fk as fk
from kasper_py.dsl._chain import Sink, Step
from kasper_py.dsl._ops import Op, StageContext, TableOp
from kasper_py.dsl._stores import StoreMaker
from kasper_py.dsl._tables import JoinHow, WindowedJoin
from kasper_py.dsl._times import TIMES, TimedAggregate, TimedCombine, Times, Timestamps
from kasper_py.exceptions import ConfigError
from kasper_py.processor import ProcessorContext
from kasper_py.stores.base import StoreSpec
from kasper_py.stores.ttl import Ttl
from kasper_py.windows import JoinWindows, StreamJoin

_PREFIX: dict[str, str] = {
    "source": "KSTREAM-SOURCE", "table": "KTABLE-SOURCE", "filter": "KSTREAM-FILTER",
    "filter_not": "KSTREAM-FILTER", "map": "KSTREAM-MAP", "map_values": "KSTREAM-MAPVALUES",
    "flat_map": "KSTREAM-FLATMAP", "flat_map_values": "KSTREAM-FLATMAPVALUES",
    "select_key": "KSTREAM-KEY-SELECT", "peek": "KSTREAM-PEEK", "branch": "KSTREAM-BRANCH",
    "branch_child": "KSTREAM-BRANCHCHILD", "merge": "KSTREAM-MERGE", "to": "KSTREAM-SINK",
    "repartition": "KSTREAM-SINK", "combine": "KSTREAM-COMBINE", "join": "KSTREAM-JOIN",
    "left_join": "KSTREAM-LEFTJOIN", "join_global": "KSTREAM-JOIN",
    "left_join_global": "KSTREAM-LEFTJOIN", "aggregate": "KSTREAM-AGGREGATE",
    "count": "KSTREAM-AGGREGATE", "reduce": "KSTREAM-REDUCE", "sum": "KSTREAM-REDUCE",
    "windowed_aggregate": "KSTREAM-AGGREGATE", "to_stream": "KTABLE-TOSTREAM",
    "drop_duplicates": "KSTREAM-DEDUPLICATE",
    "table_filter": "KTABLE-FILTER", "table_map_values": "KTABLE-MAPVALUES",
    "table_join": "KTABLE-JOIN", "table_left_join": "KTABLE-LEFTJOIN",
    "table_outer_join": "KTABLE-OUTERJOIN", "window_join": "KSTREAM-JOINTHIS",
    "window_left_join": "KSTREAM-LEFTTHIS", "window_outer_join": "KSTREAM-OUTERTHIS",
    "fk_subscribe": "KTABLE-FK-JOIN-SUBSCRIPTION-REGISTRATION",
    "fk_answer": "KTABLE-FK-JOIN-SUBSCRIPTION-PROCESSOR", "fk_result": "KTABLE-FK-JOIN-OUTPUT",
}
"""A node's kind (the DSL operator) to the prefix of its generated name, Kafka Streams'
where it has one (``KStreamImpl``'s ``*_NAME`` constants)."""


class Building(Protocol):
    """What a node's ``make`` is handed (``_graph.Build``): the partition's context, the
    stage's shared context, and the built table of another node."""

    context: ProcessorContext
    stage_context: StageContext

    def table(self, node: Node) -> TableOp:
        """The table operator of ``node``."""
        ...


MakeOp = Callable[[Building], Op]


@dataclass(frozen=True)
class FromRepartition:
    """A repartition of the app, by its name, as a stage reads or writes it (the
    topic's name is known only once the app runs under its ``Config.name``)."""

    name: str


Source = str | FromRepartition
"""What a stage reads: a topic, or a repartition of the app."""


@dataclass(eq=False)
class Node:
    """One operator as declared: its ``name`` (unique in its builder) and ``kind`` (the
    DSL operator), how to build it, what it reads or writes (``links``) and the stores
    it keeps (``stores``), and where its records go (a child's ``port`` names the side
    of a two-input operator). A stateless ``step`` (made by one parent only) or a
    ``sink`` has no ``make``: runs of them become one ``Chain``."""

    name: str
    kind: str
    stage: Stage
    order: int
    make: MakeOp | None = None
    step: Step | None = None
    sink: Sink | None = None
    links: tuple[Source, ...] = ()
    stores: tuple[str, ...] = ()
    children: list[tuple[Node, int | None]] = field(default_factory=list)

    def add(self, child: Node, port: int | None = None) -> Node:
        self.children.append((child, port))
        return child


@dataclass(eq=False)
class Stage:
    """A part of the graph one processor of the app runs, named ``stage-<number>``."""

    number: int
    nodes: list[Node] = field(default_factory=list)
    sources: dict[Source, list[Node]] = field(default_factory=dict)
    """What the stage reads, to the nodes reading it."""
    stores: list[StoreSpec] = field(default_factory=list)
    topics_out: list[str] = field(default_factory=list)
    repartitions_out: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"stage-{self.number}"


class Graph:
    """A builder's stages and nodes, the names it has given, its repartitions and its
    stores (``stores``: a function of (store name, windowed) making a ``StoreSpec``;
    ``cache``: the builder's default for tables; ``timestamps``: how aggregations and
    table-table joins stamp their outputs, ``_times``)."""

    def __init__(self, owner: str, stores: StoreMaker, cache: bool,
                 timestamps: Timestamps = "record", pack_repartitions: bool | None = None
                 ) -> None:
        self.owner, self.cache = owner, cache
        self.pack_repartitions = pack_repartitions
        """Whether stages write their repartitions' records packed (``None``: as
        ``_packing.packer_for`` finds from the config)."""
        self.keeps_times = timestamps == "latest"
        """Whether tables keep their times (``keep_times``), chosen once: the operators
        of either mode are made at build time (``times``, ``aggregate``, ``repartition``)."""
        self.stages: list[Stage] = []
        self.repartitions: dict[str, int | None] = {}
        self.built = False
        self._stores = stores
        self._names: set[str] = set()
        """Store, repartition and join names (one namespace: a repartition's topic and a
        store's changelog are named after them)."""
        self._node_names: set[str] = set()
        self._timed: set[str] = set()
        """The stores of kept times (``keep_times``)."""
        self._generated = self._nodes = self._stage_count = 0

    # -- names --------------------------------------------------------------------------

    def store_name(self, name: str) -> str:
        """``name``, taken for a store or a repartition; ``ConfigError`` when it is."""
        if name in self._names:
            raise ConfigError("dsl", f"the name {name!r} is taken in builder {self.owner!r}: "
                              "give the store another name")
        self._names.add(name)
        return name

    def auto_name(self, what: str) -> str:
        """The first free ``<what>-<n>`` of the store names."""
        number = 0
        while f"{what}-{number}" in self._names:
            number += 1
        return f"{what}-{number}"

    def node_name(self, kind: str, given: str | None) -> str:
        """``given``, or a name generated as Kafka Streams does (``<PREFIX>-<index>``, the
        index counting every generated name, ten digits); ``ConfigError`` for a name
        given twice."""
        if given == "":
            raise ConfigError("dsl", "an operator name must not be empty")
        if given is not None:
            if given in self._node_names:
                raise ConfigError("dsl", f"operator name {given!r} is taken in builder "
                                  f"{self.owner!r}: operator names are unique per builder")
            self._node_names.add(given)
            return given
        name = f"{_PREFIX[kind]}-{self._generated:010d}"
        self._generated += 1
        if name in self._node_names:  # a user gave it: the next index
            return self.node_name(kind, None)
        self._node_names.add(name)
        return name

    # -- stages and nodes ---------------------------------------------------------------

    def stage(self) -> Stage:
        """A new stage; ``ConfigError`` once the builder was built."""
        if self.built:
            raise ConfigError("dsl", f"builder {self.owner!r} was built already")
        stage = Stage(self._stage_count)  # a merged stage's number is not given again
        self._stage_count += 1
        self.stages.append(stage)
        return stage

    def node(self, kind: str, stage: Stage, name: str | None = None, **parts: Any) -> Node:
        """A node of ``stage`` named ``name`` (else generated)."""
        node = Node(self.node_name(kind, name), kind, stage, self._nodes, **parts)
        self._nodes += 1
        stage.nodes.append(node)
        return node

    def then(self, parent: Node, kind: str, name: str | None = None, *,
             port: int | None = None, **parts: Any) -> Node:
        """A node of ``parent``'s stage that ``parent`` hands its records to."""
        return parent.add(self.node(kind, parent.stage, name, **parts), port)

    def source(self, stage: Stage, sources: tuple[Source, ...], kind: str = "source",
               name: str | None = None, **parts: Any) -> Node:
        """A head of ``stage`` reading ``sources`` (handing their records on, unless
        ``parts`` give it an operator)."""
        if "make" not in parts:
            parts["step"] = Step("pass")
        head = self.node(kind, stage, name, links=sources, **parts)
        for source in sources:
            stage.sources.setdefault(source, []).append(head)
        return head

    def store(self, stage: Stage, name: str, windowed: bool = False,
              ttl: float | Ttl | None = None) -> None:
        """Keep the store ``name`` on ``stage`` (its keys removed ``ttl`` after their last
        write, when given)."""
        stage.stores.append(self._stores(name, windowed, ttl))

    def keep_times(self, stage: Stage, *tables: tuple[str, float | Ttl | None] | None
                   ) -> None:
        """Keep the times of each of ``tables`` (its store's name and ttl; ``None``: a
        table whose times need no store of their own) in a store on ``stage``
        (``_times``), once, removed with the table's keys."""
        if not self.keeps_times:
            return
        for store, ttl in filter(None, tables):
            name = TIMES.format(store)
            if name not in self._timed:
                self.store(stage, self.store_name(name), ttl=ttl)
                self._timed.add(name)

    def times(self, build: Building, store: str) -> Times | None:
        """The kept times of the table in store ``store``, when they are kept."""
        name = TIMES.format(store)
        return Times(build.context.store(name)) if name in self._timed else None

    def aggregate(self, build: Building, store: str, folding: agg.Folding, cache: bool
                  ) -> agg.Aggregate:
        """The operator folding records into the table in store ``store``."""
        times, skips = self.times(build, store), build.stage_context.skips
        if times is None:
            return agg.Aggregate(build.context.store(store), folding, cache, skips)
        return TimedAggregate(build.context.store(store), times, folding, cache, skips)

    def keep(self, stage: Stage, spec: StoreSpec) -> None:
        """Keep the store ``spec`` (a global table's) on ``stage``, once."""
        if spec not in stage.stores:
            stage.stores.append(spec)

    def cached(self, cache: bool | None) -> bool:
        return self.cache if cache is None else cache

    def merge(self, into: Stage, *others: Stage) -> Stage:
        """``others`` merged into ``into`` (things partitioned alike joined or merged):
        their nodes, sources, stores and outputs move to it and they leave the graph."""
        for other in dict.fromkeys(others):  # two of them may share a stage
            if other is into:
                continue
            for node in other.nodes:
                node.stage = into
            into.nodes += other.nodes
            for source, nodes in other.sources.items():
                into.sources.setdefault(source, []).extend(nodes)
            into.stores += other.stores
            into.topics_out += other.topics_out
            into.repartitions_out += other.repartitions_out
            self.stages.remove(other)
        return into

    # -- what crosses stages ------------------------------------------------------------

    def repartition(self, parent: Node, name: str, partitions: int | None = None, *,
                    combine: agg.Folding | None = None) -> Node:
        """Send ``parent``'s records through the repartition ``name`` (``combine``:
        folded per key and batch first); returns the head of the new stage reading it."""
        name = self.store_name(name)
        self.repartitions[name] = partitions
        target = FromRepartition(name)
        parent.stage.repartitions_out.append(name)
        if combine is None:
            self.then(parent, "repartition", sink=Sink("repartition", name), links=(target,))
        else:
            combiner = TimedCombine if self.keeps_times else agg.Combine
            self.then(parent, "combine", links=(target,), make=lambda b: combiner(
                b.stage_context, name, combine))
        return self.source(self.stage(), (target,))

    def to(self, parent: Node, topic: str, name: str | None) -> Node:
        """Send ``parent``'s records to the topic ``topic``."""
        parent.stage.topics_out.append(topic)
        return self.then(parent, "to", name, sink=Sink("topic", topic), links=(topic,))

    def windowed_join(self, mine: Node, theirs: Node,
                      joiner: Callable[[Any, Any], Any], how: JoinHow,
                      windows: JoinWindows, *, store: str | None, name: str | None) -> Node:
        """Kafka Streams' ``KStream.join(KStream, ValueJoiner, JoinWindows)`` of the
        streams ``mine`` and ``theirs`` (co-partitioned: their stages merge), both sides
        buffered in the windowed store ``store`` (changelog-backed with RocksDB)."""
        stage = self.merge(mine.stage, theirs.stage)
        store = self.store_name(store or self.auto_name("join-store"))
        self.store(stage, store, True)
        kind = "window_join" if how == "inner" else f"window_{how}_join"
        joined = self.then(mine, kind, name, port=0, stores=(store,), make=lambda b: (
            WindowedJoin(StreamJoin(
                b.context, store, before=windows.before_ms / 1000,
                after=windows.after_ms / 1000, grace=windows.grace_ms / 1000, how=how),
                joiner, b.stage_context.skips)))
        theirs.add(joined, 1)
        return joined

    def foreign_key_join(self, mine: Node, theirs: Node, foreign_key: Callable[[Any], Any],
                         joiner: Callable[[Any, Any], Any], *, left: bool, store: str | None,
                         cache: bool | None, name: str | None) -> Node:
        """The foreign-key join of the tables ``mine`` and ``theirs`` (``Table.join_foreign``)
        wired through its two repartitions; returns the result's node."""
        store = self.store_name(store or self.auto_name("fk-join"))
        subscription, response, state, subscribers = (
            self.store_name(f"{store}-{part}")
            for part in ("subscription", "response", "state", "subscribers"))
        self.repartitions.update({subscription: None, response: None})
        left_stage, right_stage = mine.stage, theirs.stage
        self.store(left_stage, state)
        self.store(left_stage, store)
        self.store(right_stage, subscribers)
        left_stage.repartitions_out.append(subscription)
        right_stage.repartitions_out.append(response)
        cached = self.cached(cache)
        subscribe = self.then(
            mine, "fk_subscribe", links=(FromRepartition(subscription),), stores=(state,),
            make=lambda b: fk.Subscribe(b.stage_context, b.context.store(state), subscription,
                                        foreign_key, joiner, left=left))
        result = self.then(subscribe, "fk_result", name, port=1, stores=(store,),
                           make=lambda b: fk.Result(b.context.store(store), b.table(mine),
                                                    joiner, left, cached,
                                                    times=self.times(b, store)))
        answer = self.then(
            theirs, "fk_answer", port=1, links=(FromRepartition(response),),
            stores=(subscribers,), make=lambda b: fk.Answer(
                b.stage_context, b.context.store(subscribers), b.table(theirs), response))
        for stage, repartition, target in ((right_stage, subscription, answer),
                                           (left_stage, response, result)):
            head = self.source(stage, (FromRepartition(repartition),), make=_hand_on)
            head.add(target, 0)
        return result


def _hand_on(_build: Building) -> Op:
    """An operator that hands its records on as they came."""
    return Op()
