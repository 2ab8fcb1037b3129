"""An ``App``: several processors in one process, joined by repartition topics the app
owns and by channels (in-process hand-offs). This module holds the declarations and
their checks: what each processor reads, sends to and stores, in an order that puts
every channel's writers before its readers. ``kasper_py.app.plan`` turns an app into
what the loop runs; ``kasper_py.app.runtime`` runs its processors in a turn.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, tzinfo

from kasper_py.exceptions import ConfigError
from kasper_py.kafka.topics import repartition_topic
from kasper_py.processor import ProcessorFactory
from kasper_py.stores.base import StoreSpec
from kasper_py.time import Task, TaskFunction

__all__ = ["App", "Channel", "Node", "Operator", "Repartition"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


@dataclass(frozen=True)
class Repartition:
    """A topic the app owns, ``<Config.name>-<name>-repartition``: a processor sends to
    it by key (``sender.repartition(name, value, key)``), another processor of the app
    reads it, so records move to the partition their new key hashes to (murmur2, as
    the Java client). Created at start with ``partitions``, else the input topics'
    count; the processors reading it are co-partitioned with it alone (and what they
    read beside it), and an existing topic with another count refuses to start.
    ``config``: topic settings it is created with."""

    name: str
    partitions: int | None = None
    config: Mapping[str, str] = field(default_factory=dict)

    def topic(self, app_name: str) -> str:
        """The topic's name for an app whose ``Config.name`` is ``app_name``."""
        return repartition_topic(app_name, self.name)


@dataclass(frozen=True)
class Channel:
    """An in-process hand-off between processors of one app, never written to Kafka:
    what a processor sends to it (``sender.channel(name, value, key)``) is processed by
    the channel's readers in the same turn, on the same partition, before anything of
    the turn is committed. A crash anywhere in the turn loses the channel's messages
    and commits nothing, so the replayed input sends them again."""

    name: str


Input = str | Repartition | Channel
"""What a processor reads: a topic name, a repartition of its app, or a channel."""
Output = str | Repartition | Channel
"""What a processor sends to (declared for ``kasper app describe``; repartitions and
channels must be declared to be sent to)."""


@dataclass(frozen=True)
class Operator:
    """One operator a processor runs, for ``kasper app describe`` (the streams DSL
    declares them): its ``name`` and ``kind``, the topics and repartitions it reads or
    sends to (``links``), the stores it keeps, and the operators it hands records to."""

    name: str
    kind: str
    links: tuple[Input, ...] = ()
    stores: tuple[str, ...] = ()
    to: tuple[str, ...] = ()


@dataclass(frozen=True)
class Node:
    """One processor of an app, as declared with ``App.processor``."""

    name: str
    factory: ProcessorFactory
    inputs: tuple[Input, ...]
    outputs: tuple[Output, ...]
    stores: tuple[StoreSpec, ...]
    operators: tuple[Operator, ...] = ()
    """What it runs, operator by operator, when its declaration says (the DSL's)."""

    @property
    def topics(self) -> tuple[str, ...]:
        """The input topics it reads from Kafka, not the repartitions."""
        return tuple(i for i in self.inputs if isinstance(i, str))

    def reads(self, kind: type[Repartition] | type[Channel]) -> tuple[str, ...]:
        """The names of the repartitions or channels it reads."""
        return tuple(i.name for i in self.inputs if isinstance(i, kind))

    def sends(self, kind: type[Repartition] | type[Channel]) -> tuple[str, ...]:
        """The names of the repartitions or channels it declares as outputs."""
        return tuple(o.name for o in self.outputs if isinstance(o, kind))


class App:
    """Several processors run by one loop: one consumer, one producer, one turn across
    all of them and one commit (with exactly-once, one transaction).

        app = App("clicks")
        by_user = app.repartition("by-user")
        app.processor("parse", Parse, inputs=["page-views"], outputs=[by_user])
        app.processor("count", Count, inputs=[by_user], stores=[RocksDBStoreSpec("n")])

    Run it as ``kasper run module:app``, ``TopicProcessor(config, app)`` or
    ``ProcessorDriver(app)``; ``Config.name`` defaults to the app's ``name`` on the
    command line, and names its internal topics. Declaration errors raise
    ``ConfigError`` naming the processor, topic, repartition or channel."""

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not _NAME.match(name):
            raise ConfigError("app", f"an app name must match {_NAME.pattern}, got {name!r}")
        self.name = name
        self.nodes: list[Node] = []
        """The processors, in declaration order."""
        self.repartitions: dict[str, Repartition] = {}
        self.channels: dict[str, Channel] = {}
        self.tasks: list[Task] = []
        """Wall-clock tasks the app runs (``App.task``)."""

    def repartition(self, name: str, *, partitions: int | None = None,
                    config: Mapping[str, str] | None = None) -> Repartition:
        """Declare the repartition ``name`` (see ``Repartition``)."""
        self._check_new(name, "repartition")
        if partitions is not None and (type(partitions) is not int or partitions < 1):
            raise ConfigError("app", f"repartition {name!r}: partitions must be a positive "
                              f"int, got {partitions!r}")
        found = Repartition(name, partitions, dict(config or {}))
        if not _TOPIC.match(found.topic(self.name)):
            raise ConfigError("app", f"repartition {name!r}: {found.topic(self.name)!r} is "
                              "not a topic name")
        self.repartitions[name] = found
        return found

    def channel(self, name: str) -> Channel:
        """Declare the channel ``name`` (see ``Channel``)."""
        self._check_new(name, "channel")
        found = self.channels[name] = Channel(name)
        return found

    def processor(self, name: str, factory: ProcessorFactory, *, inputs: Sequence[Input],
                  outputs: Sequence[Output] = (), stores: Sequence[StoreSpec] = (),
                  operators: Sequence[Operator] = ()) -> Node:
        """Declare the processor ``name``: ``factory`` builds it per partition (a
        ``MessageProcessor`` subclass is its own factory), given only its own
        ``stores``; it is handed the messages of ``inputs`` (topics, this app's
        repartitions and channels), grouped by input as a lone processor gets its
        topics. Store names are unique across the app. ``operators``: what the
        processor runs, in order, for ``describe`` (nothing else reads them)."""
        self._check_new(name, "processor")
        if not callable(factory):
            raise ConfigError("app", f"processor {name!r}: factory must be callable, got "
                              f"{factory!r}")
        node = Node(name, factory, tuple(inputs), tuple(outputs), tuple(stores),
                    tuple(operators))
        if not node.inputs:
            raise ConfigError("app", f"processor {name!r} reads nothing: give inputs")
        for item in (*node.inputs, *node.outputs):
            self._check_link(name, item)
        keys = [i if isinstance(i, str) else (type(i).__name__, i.name) for i in node.inputs]
        if len(set(keys)) != len(keys):
            raise ConfigError("app", f"processor {name!r} lists an input twice")
        taken = {spec.name for other in self.nodes for spec in other.stores}
        names = [spec.name for spec in node.stores]
        clash = sorted(taken.intersection(names)) or sorted(
            {n for n in names if names.count(n) > 1})
        if clash:
            raise ConfigError("app", f"processor {name!r}: store names {clash} are taken; "
                              "store names are unique across an app")
        self.nodes.append(node)
        return node

    def task(self, fn: TaskFunction, *, every: float | None = None, cron: str | None = None,
             name: str | None = None, on_leader: bool = False,
             timezone: tzinfo = UTC, once: bool = False, delay: float | None = None) -> Task:
        """Run ``fn(timestamp_ms, sender)`` on the wall clock (``kasper_py.time.Task``:
        ``every``, ``cron``, or ``once``/``delay`` once per start); with ``on_leader``,
        in one process of the app at a time."""
        task = Task(fn, every=every, cron=cron, name=name, timezone=timezone,
                    on_leader=on_leader, once=once, delay=delay)
        self.tasks.append(task)
        return task

    def as_processor(self) -> tuple[ProcessorFactory, list[StoreSpec]]:
        """A one-processor app without repartitions or channels as a lone processor:
        its factory and stores, for the runners that take only those (``kasper
        reprocess``, ``kasper stream``). ``ConfigError`` for any other app."""
        nodes = self.ordered()
        if len(nodes) != 1 or self.repartitions or self.channels or self.tasks:
            raise ConfigError("app", f"app {self.name!r} has {len(nodes)} processors, "
                              f"{len(self.repartitions)} repartitions, {len(self.channels)} "
                              f"channels and {len(self.tasks)} tasks: only one processor "
                              "with none of the rest runs where a lone processor does "
                              "(Spark); run the app with `kasper run`")
        return nodes[0].factory, list(nodes[0].stores)

    # -- what the app reads, in order ----------------------------------------------------

    @property
    def sources(self) -> tuple[str, ...]:
        """The topics the app reads that it does not own, in declaration order."""
        seen: dict[str, None] = {}
        for node in self.nodes:
            seen.update(dict.fromkeys(node.topics))
        return tuple(seen)

    @property
    def stores(self) -> list[StoreSpec]:
        """Every processor's stores."""
        return [spec for node in self.nodes for spec in node.stores]

    def ordered(self) -> list[Node]:
        """The processors checked and in turn order: every channel's writers before its
        readers, otherwise as declared. ``ConfigError`` for an app with no processor,
        a repartition or channel nobody reads or writes, or a cycle of channels."""
        if not self.nodes:
            raise ConfigError("app", f"app {self.name!r} has no processor")
        for kind, declared in ((Repartition, self.repartitions), (Channel, self.channels)):
            for name in declared:
                self._check_used(kind, name)
        return _channel_order(self.nodes)

    def _check_used(self, kind: type[Repartition] | type[Channel], name: str) -> None:
        what = kind.__name__.lower()
        if not any(name in node.sends(kind) for node in self.nodes):
            raise ConfigError("app", f"{what} {name!r} of app {self.name!r}: no processor "
                              "declares it in outputs")
        if not any(name in node.reads(kind) for node in self.nodes):
            raise ConfigError("app", f"{what} {name!r} of app {self.name!r}: no processor "
                              "reads it")

    def _check_new(self, name: str, what: str) -> None:
        if not isinstance(name, str) or not _NAME.match(name):
            raise ConfigError("app", f"{what} name must match {_NAME.pattern}, got {name!r}")
        taken = {**{n.name: "processor" for n in self.nodes},
                 **dict.fromkeys(self.repartitions, "repartition"),
                 **dict.fromkeys(self.channels, "channel")}
        if name in taken:
            raise ConfigError("app", f"{what} {name!r}: the name is taken by a {taken[name]} "
                              f"of app {self.name!r}")

    def _check_link(self, node: str, item: object) -> None:
        if isinstance(item, str):
            if not _TOPIC.match(item):
                raise ConfigError("app", f"processor {node!r}: {item!r} is not a topic name")
            if item in self.channels:
                raise ConfigError("app", f"processor {node!r}: topic {item!r} has the name "
                                  "of a channel; pass the Channel")
            return
        declared: Mapping[str, object] = (self.repartitions if isinstance(item, Repartition)
                                          else self.channels if isinstance(item, Channel)
                                          else {})
        if not declared or declared.get(getattr(item, "name", "")) is not item:
            raise ConfigError("app", f"processor {node!r}: {item!r} is not a topic name, nor "
                              f"a repartition or channel declared on app {self.name!r}")

    def __repr__(self) -> str:
        return f"App({self.name!r}, processors={[n.name for n in self.nodes]})"


def _channel_order(nodes: Sequence[Node]) -> list[Node]:
    """``nodes`` with every channel's writers before its readers (a stable topological
    sort); ``ConfigError`` naming the processors on a cycle."""
    writes = {node.name: set(node.sends(Channel)) for node in nodes}
    after: dict[str, set[str]] = {node.name: {
        other.name for other in nodes if other is not node
        and writes[other.name].intersection(node.reads(Channel))} for node in nodes}
    for node in nodes:
        if writes[node.name].intersection(node.reads(Channel)):
            raise ConfigError("app", f"processor {node.name!r} reads a channel it writes")
    ordered: list[Node] = []
    placed: set[str] = set()
    while len(ordered) < len(nodes):
        ready = [n for n in nodes if n.name not in placed and after[n.name] <= placed]
        if not ready:
            cycle = sorted(n.name for n in nodes if n.name not in placed)
            raise ConfigError("app", f"processors {cycle} form a cycle of channels")
        ordered.append(ready[0])
        placed.add(ready[0].name)
    return ordered


