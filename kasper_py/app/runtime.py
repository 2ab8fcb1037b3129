"""An app's processors inside a turn. ``AppProcessor`` is the ``MessageProcessor`` of
one partition of an app: it hands each of its processors the messages of that
processor's inputs, in channel order, so the turn engine runs an app exactly as it
runs a lone processor (stores, timers, dead letters, exactly-once, every runner).
``AppRoutes`` resolves what a processor sends to a repartition or a channel.

A channel's messages are processed in the same turn as what sent them, before the
turn's flush, produce and commit: nothing that went through a channel is committed
upstream before its downstream effects are, and a failure anywhere in the turn
commits none of it (the replayed input sends it again).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import groupby
from operator import attrgetter, countOf, itemgetter
from typing import Any

from kasper_py.app.topology import App, Channel, Node, Repartition
from kasper_py.exceptions import KasperError, TopicError
from kasper_py.message import TIMESTAMP_CREATE_TIME, TIMESTAMP_NONE, Message
from kasper_py.processor import MessageProcessor, ProcessorContext
from kasper_py.sender import Sender

__all__ = ["AppFactory", "AppProcessor", "AppRoutes", "NodeStats"]

_topic_of = attrgetter("topic")
_TOPIC = itemgetter(0)
"""A ``Message``'s topic, by position: cheaper than by name."""


@dataclass
class NodeStats:
    """Messages handed to each processor of an app and the seconds it spent in
    ``process()``, for the metrics (``kasper_app_processor_*``), across partitions."""

    messages: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, node: str, count: int, seconds: float) -> None:
        with self.lock:
            self.messages[node] = self.messages.get(node, 0) + count
            self.seconds[node] = self.seconds.get(node, 0.0) + seconds

    def snapshot(self) -> dict[str, tuple[int, float]]:
        """Per processor: (messages, seconds) so far."""
        with self.lock:
            return {n: (c, self.seconds.get(n, 0.0)) for n, c in self.messages.items()}


@dataclass(frozen=True)
class _Links:
    """What one processor reads and sends to besides topics, resolved once: the
    repartitions it may send to (name -> topic), the channels it may send to, the
    channels it reads, and the topics it reads from Kafka (its repartitions' included)."""

    repartitions: Mapping[str, str]
    channels: frozenset[str]
    reads: tuple[str, ...]
    topics: frozenset[str]


@dataclass
class _Hop:
    """The processor running now, and the channel messages of this partition's turn."""

    node: Node
    links: _Links
    partition: int
    pending: dict[str, list[Message]]


class AppRoutes:
    """One process's routes of an app: repartition names to topics, and the channel
    messages of the processor running now (``AppProcessor`` sets ``hop``)."""

    def __init__(self, app: App, app_name: str) -> None:
        self._app = app
        self._topics = {name: r.topic(app_name) for name, r in app.repartitions.items()}
        self._counts: dict[str, int] = {}
        self.hop: _Hop | None = None

    def know_counts(self, counts: Mapping[str, int]) -> None:
        """The partition counts of the app's topics (topic -> count), as the runner
        found them at start (``repartition_partitions``)."""
        self._counts = {name: counts[topic] for name, topic in self._topics.items()
                        if topic in counts}

    def repartition_partitions(self, name: str) -> int | None:
        """The partition count of repartition ``name``'s topic, ``None`` until the
        runner told it (``know_counts``)."""
        return self._counts.get(name)

    def links(self, node: Node) -> _Links:
        """What ``node`` reads and sends to, resolved (see ``_Links``)."""
        return _Links({name: self._topics[name] for name in node.sends(Repartition)},
                      frozenset(node.sends(Channel)), node.reads(Channel),
                      self.kafka_inputs(node))

    def kafka_inputs(self, node: Node) -> frozenset[str]:
        """The topics ``node`` reads from Kafka: its topics and its repartitions'."""
        return frozenset((*node.topics, *(self._topics[n] for n in node.reads(Repartition))))

    def repartition_topic(self, name: str) -> str:
        """The topic of repartition ``name``; from ``process()`` it must be one of the
        running processor's declared outputs."""
        hop = self.hop
        if hop is not None:  # a dict lookup per message on the hot path
            topic = hop.links.repartitions.get(name)
            if topic is not None:
                return topic
        topic = self._topics.get(name)
        if topic is None:
            raise ValueError(f"no repartition {name!r} in app {self._app.name!r}; "
                             f"declared: {sorted(self._topics)}")
        if hop is not None:
            raise ValueError(f"processor {hop.node.name!r} sends to repartition {name!r}, "
                             "which it does not declare: add it to its outputs")
        return topic

    def to_channel(self, name: str, key: Any, value: Any, timestamp: int | None,
                   headers: tuple[tuple[str, bytes | None], ...]) -> None:
        """Queue one message for channel ``name``'s readers in this partition's turn."""
        hop = self.hop
        if hop is None:
            raise KasperError(f"channel {name!r}: a channel carries messages between the "
                              "processors of a turn, so only process() sends to one; a "
                              "timer or task sends to a topic or a repartition")
        if name not in hop.links.channels:
            raise ValueError(f"processor {hop.node.name!r} sends to channel {name!r}, which "
                             "it does not declare: add it to its outputs")
        queued = hop.pending.setdefault(name, [])
        kind = TIMESTAMP_NONE if timestamp is None else TIMESTAMP_CREATE_TIME
        queued.append(Message(name, hop.partition, len(queued), key, value, timestamp,
                              headers, kind))


class AppProcessor(MessageProcessor):
    """The processor of one partition of an app: each of the app's processors, built
    on its own stores, in channel order (``App.ordered``)."""

    def __init__(self, context: ProcessorContext, app: App, nodes: Sequence[Node],
                 routes: AppRoutes, stats: NodeStats) -> None:
        super().__init__(context)
        self._app, self._routes, self._stats = app, routes, stats
        self.processors: dict[str, MessageProcessor] = {}
        """Each processor of the app for this partition, by name."""
        self._steps: list[tuple[Node, MessageProcessor, _Links]] = []
        for node in nodes:
            own = ProcessorContext(context.partition, context.config,
                                   {s.name: context.stores[s.name] for s in node.stores},
                                   context.clock, context.query_tables, context.observer)
            processor = self.processors[node.name] = node.factory(own)
            self._steps.append((node, processor, routes.links(node)))
        self._reads = frozenset().union(*(links.topics for _, _, links in self._steps))
        """Every topic some processor of the app reads from Kafka."""

    def process(self, messages: list[Message], sender: Sender) -> None:
        """Each processor gets its inputs' messages: its topics' in the order they came,
        then its channels' (sent by the processors before it in this call)."""
        runs = _by_topic(messages)
        for topic, run in runs:
            if topic not in self._reads:
                raise TopicError(
                    f"partition {self.context.partition} of app {self._app.name!r} (running "
                    f"as {self.context.config.name!r}): {len(run)} messages of topic "
                    f"{topic!r}, which no processor of the app reads (they read "
                    f"{sorted(self._reads)}); the turn is not committed")
        first, _, links = self._steps[0]
        hop = _Hop(first, links, self.context.partition, {})
        self._routes.hop = hop
        try:
            for node, processor, links in self._steps:
                mine = _select(runs, links.topics)
                for name in links.reads:
                    mine = [*mine, *hop.pending.pop(name, [])]
                if mine:
                    hop.node, hop.links = node, links
                    self._run(node, processor, mine, sender)
        finally:
            self._routes.hop = None

    def _run(self, node: Node, processor: MessageProcessor, messages: list[Message],
             sender: Sender) -> None:
        started = time.perf_counter()
        try:
            processor.process(messages, sender)
        except Exception as exc:
            exc.add_note(f"in processor {node.name!r} of app {self._app.name!r}")
            raise
        self._stats.record(node.name, len(messages), time.perf_counter() - started)

    def close(self) -> None:
        """Close every processor of the partition; the first error is raised after."""
        first: Exception | None = None
        for _, processor, _ in self._steps:
            try:
                processor.close()
            except Exception as exc:
                first = first or exc
        if first is not None:
            raise first


class AppFactory:
    """Builds an app's ``AppProcessor`` per partition (a ``ProcessorFactory``)."""

    def __init__(self, app: App, routes: AppRoutes, stats: NodeStats) -> None:
        self.app, self.routes, self.stats = app, routes, stats
        self._nodes = app.ordered()

    def __call__(self, context: ProcessorContext) -> AppProcessor:
        return AppProcessor(context, self.app, self._nodes, self.routes, self.stats)


def _by_topic(messages: list[Message]) -> list[tuple[str, list[Message]]]:
    """``messages`` as one run per topic, in the order the topics first come (a
    partition's batch comes topic by topic, so usually one run per topic). A batch of
    one topic, the common case, is its own run, found by one C count of its first
    message's topic (identity first: the loop's messages of a topic share its name),
    the list as it is: 74 instructions a message fewer than the grouping
    (callgrind); other batches' runs are found with ``groupby``, in C, not with a
    look-up or a test in Python per message."""
    if not messages:
        return []
    topic = messages[0].topic
    if countOf(map(_TOPIC, messages), topic) == len(messages):
        return [(topic, messages)]
    runs: dict[str, list[Message]] = {}
    for topic, run in groupby(messages, _topic_of):
        found = runs.get(topic)
        if found is None:
            runs[topic] = list(run)
        else:
            found.extend(run)
    return list(runs.items())


def _select(runs: list[tuple[str, list[Message]]], topics: frozenset[str]) -> list[Message]:
    """The messages of ``runs`` whose topic is one of ``topics``, in order (the run
    itself, not a copy, when it is the only one)."""
    if len(runs) == 1:
        return runs[0][1] if runs[0][0] in topics else []
    return [m for topic, run in runs if topic in topics for m in run]
