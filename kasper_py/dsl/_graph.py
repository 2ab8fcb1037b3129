"""The declared graph of a DSL pipeline: operator specs grouped into stages. A stage is
the part of the graph one processor of the app runs (Kafka Streams' sub-topology):
what reads its topics and repartitions, down to the next repartition. Joining two
things of different stages that are partitioned alike merges the stages; a re-keyed
stream reaches another stage through a repartition.
"""

from __future__ import annotations

import heapq
import itertools
import operator
from collections.abc import Callable
from dataclasses import dataclass, field

from kasper_py.dsl._chain import Chain, Sink, Step
from kasper_py.dsl._ops import CachedTable, OneByOne, Op, Rec, StageContext, TableOp
from kasper_py.exceptions import TopicError
from kasper_py.message import Message
from kasper_py.processor import MessageProcessor, ProcessorContext
from kasper_py.sender import Sender
from kasper_py.stores.base import StoreSpec

MakeOp = Callable[["Build"], Op]


@dataclass(eq=False)
class Spec:
    """One operator as declared: how to build it, and where its records go (a child's
    ``port`` names the side of a two-input operator). A stateless ``step`` (made by
    one parent only) or a ``sink`` has no ``make``: runs of them become one ``Chain``."""

    make: MakeOp | None
    stage: Stage
    children: list[tuple[Spec, int | None]] = field(default_factory=list)
    step: Step | None = None
    sink: Sink | None = None

    def add(self, child: Spec, port: int | None = None) -> Spec:
        self.children.append((child, port))
        return child


@dataclass(eq=False)
class Stage:
    """A part of the graph one processor runs; merged stages point to one ``into``."""

    number: int
    sources: dict[str, list[Spec]] = field(default_factory=dict)
    """Topic name, or ``"repartition:<name>"``, to the specs reading it."""
    stores: list[StoreSpec] = field(default_factory=list)
    topics_out: list[str] = field(default_factory=list)
    repartitions_out: list[str] = field(default_factory=list)
    into: Stage | None = None

    def root(self) -> Stage:
        stage = self
        while stage.into is not None:
            stage = stage.into
        return stage

    def absorb(self, other: Stage) -> Stage:
        """Merge ``other`` into this stage (both roots); returns the root."""
        mine, theirs = self.root(), other.root()
        if mine is theirs:
            return mine
        for source, specs in theirs.sources.items():
            mine.sources.setdefault(source, []).extend(specs)
        mine.stores += theirs.stores
        mine.topics_out += theirs.topics_out
        mine.repartitions_out += theirs.repartitions_out
        theirs.into = mine
        return mine


class Build:
    """Builds a stage's operators for one partition, each spec once."""

    def __init__(self, context: ProcessorContext, stage_context: StageContext) -> None:
        self.context, self.stage_context = context, stage_context
        self._ops: dict[int, Op] = {}

    def op(self, spec: Spec) -> Op:
        """The operator of ``spec``, built (with its children) on first use: a run of
        steps from ``spec`` is one ``Chain``."""
        found = self._ops.get(id(spec))
        if found is not None:
            return found
        last = spec
        if spec.make is None:
            run = fused(spec)
            last = run[-1]
            steps = [s.step for s in run if s.step is not None and s.step.kind != "pass"]
            serial = last.sink is None and reconverges(_children(last))
            if steps or last.sink or serial:
                op: Op = Chain(self.stage_context, steps, last.sink, serial=serial)
            else:
                op = Op()  # hands its records on as they came: no loop to run
        else:
            op = spec.make(self)
            # making a join builds its tables, whose children include the join: that
            # inner call built it already (with its children), and it is the one
            again = self._ops.get(id(spec))
            if again is not None:
                return again
            if isinstance(op, CachedTable):
                op.serial = reconverges(_children(spec))
        self._ops[id(spec)] = op
        for child, port in [] if last.sink else last.children:
            op.children.append(self.entry(child, port))
        return op

    def entry(self, spec: Spec, port: int | None = None) -> Op:
        """What a parent pushes ``spec``'s records to: its operator (the side ``port``
        of a join), record by record when its children's paths meet again (a chain
        keeps the batch and hands its records on one by one)."""
        op = self.op(spec)
        side = op if port is None else op.side(port)
        one_by_one = spec.make is not None and reconverges(_children(spec))
        return OneByOne(side) if one_by_one else side

    def cached(self, roots: list[Spec]) -> list[CachedTable]:
        """The built tables below ``roots`` that hold updates, upstream first."""
        ops = [self._ops.get(id(spec)) for spec in topological(roots)]
        return [op for op in ops if isinstance(op, CachedTable) and op.cache]

    def table(self, spec: Spec) -> TableOp:
        """The table operator of ``spec``."""
        op = self.op(spec)
        assert isinstance(op, TableOp)
        return op


def fused(spec: Spec) -> list[Spec]:
    """The run of steps from ``spec`` that becomes one ``Chain``: on while a step has
    one child, itself a step or a sink (a sink ends it)."""
    run = [spec]
    while run[-1].sink is None and len(run[-1].children) == 1:
        child, port = run[-1].children[0]
        if child.make is not None or port is not None:
            break
        run.append(child)
    return run


def _children(spec: Spec) -> list[Spec]:
    return [child for child, _ in spec.children]


def topological(roots: list[Spec]) -> list[Spec]:
    """Every spec reachable from ``roots``, each before every spec downstream of it."""
    order: list[Spec] = []
    seen: set[int] = set()

    def visit(spec: Spec) -> None:
        seen.add(id(spec))
        for child, _ in spec.children:
            if id(child) not in seen:
                visit(child)
        order.append(spec)

    for root in roots:
        if id(root) not in seen:
            visit(root)
    return order[::-1]


def reconverges(specs: list[Spec]) -> bool:
    """Whether two of ``specs`` reach a common operator (a diamond: a branch merged
    again, a table joined with a view of itself). Records must then go through such
    a fork one at a time, so that they meet again in their order and each sees the
    state as of itself, as a record-at-a-time run would have it."""
    seen: set[int] = set()
    for spec in specs:
        reached = _reach(spec)
        if seen & reached:
            return True
        seen |= reached
    return False


def _reach(spec: Spec) -> set[int]:
    reached, todo = set(), [spec]
    while todo:
        node = todo.pop()
        if id(node) not in reached:
            reached.add(id(node))
            todo += [child for child, _ in node.children]
    return reached


class StageProcessor(MessageProcessor):
    """The processor of one stage for one partition: each batch's messages become
    records pushed through the stage's operators, topic by topic in timestamp order
    (runs of one topic at a time), so a join sees the table as of each record."""

    def __init__(self, context: ProcessorContext, sources: dict[str, list[Spec]],
                 topic_of: Callable[[str, str], str]) -> None:
        super().__init__(context)
        self._shared = StageContext()
        build = Build(context, self._shared)
        self._sources = {topic_of(context.config.name, source): _fork(build, specs)
                         for source, specs in sources.items()}
        self._shared.cached = build.cached([s for specs in sources.values() for s in specs])
        self._chains = {topic: ops[0] for topic, ops in self._sources.items()
                        if len(ops) == 1 and isinstance(ops[0], Chain)}
        """The topics one chain alone reads (``Chain.push_messages``)."""
        extractor = context.config.timestamp_extractor
        self._time = context.event_time if extractor is not None else _kafka_time

    def process(self, messages: list[Message], sender: Sender) -> None:
        """Push the batch through the stage; then the tables emit what they held."""
        self._shared.sender = sender
        self._shared.start()
        self._push_batch(messages)
        self._shared.end()

    def _push_batch(self, messages: list[Message]) -> None:
        if (len(self._sources) == 1 and self._time is _kafka_time and messages
                and messages[0].topic in self._sources
                and messages[-1].topic == messages[0].topic):
            # the common case, one input and Kafka's timestamps: no call per message (the
            # app hands a stage only the topics it reads, and a batch comes topic by
            # topic, so its ends name the one topic; anything else takes the checked path)
            # a chain reading the topic takes the messages as they are; another operator
            # (key, value, timestamp, headers), a slice of a Message: one C call
            topic = messages[0].topic
            chain = self._chains.get(topic)
            if chain is not None:
                chain.push_messages(messages)
            else:
                self._push(topic, list(map(_RECORD_OF, messages)))
            return
        when = self._time
        runs: dict[str, list[Rec]] = {}
        for m in messages:
            runs.setdefault(m.topic, []).append((m.key, m.value, when(m), m.headers))
        if len(runs) == 1:
            for topic, records in runs.items():
                self._push(topic, records)
            return
        merged = heapq.merge(*([(topic, r) for r in records] for topic, records in runs.items()),
                             key=lambda item: item[1][2] or 0)
        for topic, chunk in itertools.groupby(merged, key=lambda item: item[0]):
            self._push(topic, [item[1] for item in chunk])

    def _push(self, topic: str, records: list[Rec]) -> None:
        ops = self._sources.get(topic)
        if ops is None:
            raise TopicError(
                f"partition {self.context.partition} of {self.context.config.name!r}: "
                f"{len(records)} records of topic {topic!r}, which this stage does not read "
                f"(it reads {sorted(self._sources)}); the turn is not committed")
        for op in ops:
            op.push(records)


def _fork(build: Build, specs: list[Spec]) -> list[Op]:
    """The operators reading one source, as a single one taking the records one by
    one when their paths meet again."""
    ops = [build.entry(spec) for spec in specs]
    if len(ops) > 1 and reconverges(specs):
        fork = Op()
        fork.children = ops
        return [OneByOne(fork)]
    return ops


_RECORD_OF = operator.itemgetter(slice(3, 7))
"""A ``Message``'s (key, value, timestamp, headers): fields 3 to 6 (48 ns a message
against 79 ns for a tuple of its attributes, measured over 10,000)."""


def _kafka_time(message: Message) -> int | None:
    return message.timestamp


def stage_factory(sources: dict[str, list[Spec]], topic_of: Callable[[str, str], str]
                  ) -> Callable[[ProcessorContext], StageProcessor]:
    """A ``ProcessorFactory`` of the stage reading ``sources``."""

    def factory(context: ProcessorContext) -> StageProcessor:
        return StageProcessor(context, sources, topic_of)

    return factory
