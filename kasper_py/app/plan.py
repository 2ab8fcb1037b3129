"""``Plan``: what a loop, the testing driver or the CLI runs for a target, a lone
processor factory or an ``App``, chosen once: the config (an app's repartition topics
added to its inputs), one factory, the stores, the tasks, the internal topics to create
at start and the routes its senders use. A lone processor's plan is itself, unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

from kasper_py.app.runtime import AppFactory, AppRoutes, NodeStats
from kasper_py.app.topology import App, Channel, Node, Repartition
from kasper_py.config import Config, OutputTopic
from kasper_py.exceptions import ConfigError
from kasper_py.kafka.topics import internal_specs, leader_topic, source_counts, task_count
from kasper_py.message import TopicPartitionKey
from kasper_py.processor import ProcessorFactory
from kasper_py.stores.base import StoreSpec
from kasper_py.stores.specs import check_unique_names
from kasper_py.time import Task

__all__ = ["Plan", "RunTarget", "describe", "plan_for", "read_together"]


@dataclass(frozen=True)
class RunTarget:
    """What a runner was given, told apart once: a lone processor ``factory``, or an
    ``app`` (exactly one of the two is set). Every runner, the CLI and the testing
    driver ask ``RunTarget.of`` rather than checking the type themselves."""

    factory: ProcessorFactory | None = None
    app: App | None = None

    @classmethod
    def of(cls, target: ProcessorFactory | App | object) -> RunTarget:
        """``target`` classified: an ``App``, or else a factory (whether it is callable
        is the caller's to check, in the words its user knows: the CLI's, say)."""
        if isinstance(target, App):
            return cls(app=target)
        return cls(factory=cast(ProcessorFactory, target))


@dataclass(frozen=True)
class Plan:
    """What runs: ``config``, ``factory``, ``stores`` and ``tasks``; for an app, also
    the topics it owns (``internal``, created at start with the ``sources``' partition
    count), its ``routes`` and per-processor ``stats``."""

    config: Config
    factory: ProcessorFactory
    stores: list[StoreSpec]
    tasks: list[Task]
    sources: tuple[str, ...]
    """The input topics the target does not own."""
    internal: tuple[OutputTopic, ...] = ()
    routes: AppRoutes | None = None
    stats: NodeStats | None = None
    app: App | None = None

    def store_topics(self) -> dict[str, frozenset[str]]:
        """The topics each store's processor reads from Kafka, by store name: an app's
        stage may read fewer partitions than the loop runs. Empty for a lone processor,
        whose stores read every input topic."""
        if self.app is None or self.routes is None:
            return {}
        return {spec.name: self.routes.kafka_inputs(node)
                for node in self.app.nodes for spec in node.stores}

    def partition_numbers(self, metadata: Any) -> int:
        """How many partition numbers the loop runs (``topics.task_count``), from
        cluster ``metadata``: the largest count of the sources and the internal topics
        (each its declared count, else the sources'). ``TopicError`` as ``task_count``
        says, or naming a missing source."""
        counts = source_counts(self.config, self.sources, metadata)
        counts.update({spec.name: spec.partitions
                       for spec in internal_specs(counts, self.internal)})
        return task_count(self.config, counts)


def plan_for(target: ProcessorFactory | App, config: Config, *,
             stores: Sequence[StoreSpec] = (), tasks: Sequence[Task] = ()) -> Plan:
    """The plan of ``target`` under ``config``. An app declares its own inputs and
    stores: ``config.input_topics`` must list exactly the topics its processors read
    (``App.sources``), and ``stores`` must be empty; ``ConfigError`` otherwise, or for
    a declaration error (``App.ordered``)."""
    run = RunTarget.of(target)
    if run.app is None:
        assert run.factory is not None
        check_unique_names(stores)
        return Plan(config, run.factory, list(stores), list(tasks), tuple(config.input_topics))
    app = run.app
    app.ordered()  # checked before anything else
    if stores:
        raise ConfigError("stores", f"app {app.name!r} declares its stores per processor "
                          "(App.processor(..., stores=)); pass none beside it")
    sources = app.sources
    if set(config.input_topics) != set(sources):
        raise ConfigError("input_topics", f"app {app.name!r} reads {list(sources)}, but "
                          f"input_topics lists {list(config.input_topics)}: give the app's "
                          "own (App.sources; `kasper run` does when input_topics is unset)")
    internal = tuple(OutputTopic(r.topic(config.name), r.partitions, None,
                                 {"cleanup.policy": "delete", **r.config})
                     for r in app.repartitions.values())
    routes, stats = AppRoutes(app, config.name), NodeStats()
    run_config = replace(config, input_topics=(*sources, *(t.name for t in internal)),
                         input_groups=read_together([routes.kafka_inputs(n)
                                                     for n in app.nodes]))
    factory = AppFactory(app, routes, stats)
    return Plan(run_config, factory, app.stores, [*app.tasks, *tasks], sources, internal,
                routes, stats, app)


def read_together(inputs: Sequence[frozenset[str]]) -> tuple[tuple[str, ...], ...]:
    """The groups of topics read together (co-partitioned), from what each processor
    reads from Kafka (``inputs``): topics one processor reads share a group, and so do
    the groups that share a topic. Each group in its topics' first order."""
    groups: list[set[str]] = []
    for topics in inputs:
        joined = set(topics)
        for group in [g for g in groups if g & joined]:
            joined |= group
            groups.remove(group)
        if joined:
            groups.append(joined)
    order = [t for topics in inputs for t in sorted(topics)]
    return tuple(tuple(sorted(g, key=order.index)) for g in groups)


def _partitions(repartition: Repartition, topic: str, config: Config | None,
                owners: Mapping[TopicPartitionKey, str] | None) -> dict[str, Any]:
    """A repartition's count (``None``: the sources') and who runs its partitions: a
    static set, the partitions of it this process owns; else every partition number's
    owner (all of them, a ``--processes`` worker each, or the group). In group mode with
    the group's ``owners`` read: the member holding each partition (``-``: none yet)."""
    count = repartition.partitions
    owned = None if config is None else config.input_partitions
    group = config is not None and config.group_mode
    runs: Any = ("group" if group else "all" if owned is None
                 else [p for p in owned if count is None or p < count])
    found = {"count": count, "runs": runs}
    if group and owners is not None:
        held = {p: who for (t, p), who in owners.items() if t == topic}
        numbers = range(count) if count is not None else sorted(held)
        found["members"] = {str(p): held.get(p, "-") for p in numbers}
    return found


def describe(app: App, config: Config | None = None,
             owners: Mapping[TopicPartitionKey, str] | None = None) -> dict[str, Any]:
    """The app's topology as plain data (``kasper app describe``): its processors in
    turn order, each with inputs, outputs and stores (and its operators in order, when
    declared: a DSL stage's named nodes, as Kafka Streams' ``Topology.describe()``);
    its internal topics (named after ``config.name``, else the app's name), who runs
    their partitions (in group mode, with the group's ``owners``, each one's member)
    and channels; its tasks."""
    name = config.name if config is not None else app.name
    nodes = app.ordered()

    def link(item: object) -> str:
        if isinstance(item, Repartition):
            return f"repartition:{item.name} ({item.topic(name)})"
        if isinstance(item, Channel):
            return f"channel:{item.name}"
        return f"topic:{item}"

    def processor(node: Node) -> dict[str, Any]:
        found = {"name": node.name, "inputs": [link(i) for i in node.inputs],
                 "outputs": [link(o) for o in node.outputs],
                 "stores": [{"name": s.name, "kind": type(s).__name__} for s in node.stores]}
        if node.operators:
            found["operators"] = [
                {"name": o.name, "kind": o.kind,
                 "links": [*map(link, o.links), *(f"store:{s}" for s in o.stores)],
                 "to": list(o.to)} for o in node.operators]
        return found

    return {
        "app": app.name, "name": name, "sources": list(app.sources),
        "processors": [processor(n) for n in nodes],
        "internal_topics": [*(r.topic(name) for r in app.repartitions.values()),
                            *([leader_topic(name)] if any(t.on_leader for t in app.tasks)
                              else [])],
        "partitions": {r.topic(name): _partitions(r, r.topic(name), config, owners)
                       for r in app.repartitions.values()},
        "channels": list(app.channels),
        "tasks": [{"name": t.name, "on_leader": t.on_leader} for t in app.tasks],
    }
