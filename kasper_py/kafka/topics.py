"""Topics checked against cluster metadata, the same way for the live loop, the CLI and
the reprocess driver. Input topics: every one exists, all have one partition count (so
partition-wise processing is possible), and the configured partitions exist. The
topics kasper_py creates (output, internal, leader, changelog) are described here as
``TopicSpec`` values; ``KafkaAdmin.ensure`` (``admin_topics``) creates and checks them.
Pure: the metadata comes in from the caller.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from confluent_kafka import KafkaError

from kasper_py.config import Config, OutputTopic
from kasper_py.exceptions import TopicError
from kasper_py.message import TopicPartitionKey

__all__ = ["REPARTITION_CONFIG", "TopicKind", "TopicSpec", "changelog_spec", "changelog_topic",
           "check_internal_topics", "common_partition_count", "input_partitions",
           "internal_specs", "internal_to_create", "leader_group", "leader_spec",
           "leader_topic", "output_specs", "owned_partitions", "partition_count",
           "repartition_topic", "source_counts", "task_count", "topic_counts", "topic_keys",
           "topic_problem"]

_ABSENT = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC})
_REFUSED = frozenset({KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.TOPIC_EXCEPTION})


def partition_count(config: Config, metadata: Any) -> int:
    """The partition numbers the loop runs (``task_count``), from ``list_topics()``'s
    ``metadata``; ``TopicError`` as ``topic_counts`` and ``task_count`` say."""
    return task_count(config, topic_counts(config, metadata))


def topic_counts(config: Config, metadata: Any) -> dict[str, int]:
    """Each input topic's partition count in ``metadata``; ``TopicError`` naming a
    missing topic."""
    counts: dict[str, int] = {}
    for topic in config.input_topics:
        meta = metadata.topics.get(topic)
        if meta is None or meta.error is not None:
            reason = "does not exist" if meta is None else meta.error.str()
            raise TopicError(f"input topic {topic!r}: {reason} on {config.bootstrap_servers}")
        counts[topic] = len(meta.partitions)
    return counts


def task_count(config: Config, counts: Mapping[str, int]) -> int:
    """How many partition numbers the loop runs for input topics of ``counts`` (topic
    -> its count): the largest count. The topics of each group read together
    (``Config.input_groups``; all of them when unset) must share one count, else a
    ``TopicError`` listing them."""
    for group in config.input_groups or (config.input_topics,):
        common_partition_count({t: counts[t] for t in group})
    return max(counts[t] for t in config.input_topics)


def topic_keys(topics: Sequence[str], counts: Mapping[str, int] | None,
               partitions: Sequence[int]) -> list[TopicPartitionKey]:
    """Partition numbers ``partitions`` of ``topics`` as keys, topic by topic: those
    each topic has (``counts``: topic -> its count; all of them while the counts are
    not read yet, ``None`` or empty)."""
    return [(t, p) for t in topics for p in partitions if not counts or p < counts[t]]


def common_partition_count(counts: Mapping[str, int]) -> int:
    """The partition count every input topic shares (``counts``: topic -> its count);
    ``TopicError`` listing them when they differ. The in-memory broker checks with it too."""
    if len(set(counts.values())) > 1:
        listed = ", ".join(f"{t}={n}" for t, n in counts.items())
        raise TopicError("input topics read together must have the same partition count to "
                         f"be processed partition-wise; found {listed}")
    return next(iter(counts.values()))


def owned_partitions(config: Config, count: int) -> list[int]:
    """The partition numbers this process owns when the topics have ``count`` each;
    ``TopicError`` names configured ``input_partitions`` past the count."""
    wanted = config.input_partitions
    if wanted is None:
        return list(range(count))
    missing = [p for p in wanted if p >= count]
    if missing:
        raise TopicError(f"input_partitions {missing} do not exist: the input topics "
                         f"{list(config.input_topics)} have {count} partitions")
    return list(wanted)


def input_partitions(config: Config, metadata: Any) -> list[TopicPartitionKey]:
    """Every (topic, partition) this process owns, topic by topic; ``TopicError`` as
    ``partition_count`` and ``owned_partitions`` say."""
    counts = topic_counts(config, metadata)
    owned = owned_partitions(config, task_count(config, counts))
    return topic_keys(config.input_topics, counts, owned)


# -- output topics ----------------------------------------------------------------------

def topic_problem(meta: Any) -> str | None:
    """Why a topic cannot be produced to, from its entry in ``list_topics()``'s metadata
    (``None`` when the metadata has none), or ``None`` when it can. A transient error (a
    new topic whose leader is not elected yet) is no problem: the producer waits it out."""
    if meta is None:
        return "does not exist"
    error = meta.error
    if error is None:
        return None
    if error.code() in _ABSENT:
        return "does not exist"
    return str(error.str()) if error.code() in _REFUSED else None


# -- what every kind of topic is created with and checked against ------------------------

TopicKind = Literal["output", "internal", "leader", "changelog"]
PartitionRule = Literal["exact", "at_least", "any"]

REPARTITION_CONFIG: Mapping[str, str] = {"cleanup.policy": "delete", "retention.ms": "-1"}
"""What an app's repartition topics are created with. Records keep their input
timestamps, so time-based retention could delete old input reprocessed through a
repartition before the downstream stage reads it; they are kept until that stage has
committed them, then purged (``kasper_py.kafka.purge``), as Kafka Streams does."""


@dataclass(frozen=True)
class TopicSpec:
    """A topic kasper_py creates when absent and checks when present
    (``KafkaAdmin.ensure``): output, internal (an app's repartitions), leader or
    changelog."""

    name: str
    kind: TopicKind
    partitions: int
    """Created with this many; an existing topic is checked by ``rule``."""
    rule: PartitionRule = "exact"
    """``exact``: an existing topic has ``partitions``; ``at_least``: as many or more
    (a changelog); ``any``: taken as it is (an undeclared output count, the leader)."""
    replication_factor: int = -1
    """Replicas it is created with; -1: the broker's ``default.replication.factor``."""
    config: Mapping[str, str] = field(default_factory=dict)
    """Topic settings it is created with (``cleanup.policy``, ``retention.ms``...)."""

    def mismatch(self, found: int, servers: str) -> str | None:
        """Why an existing topic with ``found`` partitions on ``servers`` does not do,
        naming the fix; ``None`` when it does."""
        if (self.rule == "any" or found == self.partitions
                or (self.rule == "at_least" and found > self.partitions)):
            return None
        if self.kind == "output":
            return (f"output topic {self.name!r} is declared with {self.partitions} "
                    f"partitions but has {found} on {servers}: fix the declaration "
                    "(Config.output_topics), or recreate the topic")
        if self.kind == "changelog":
            return (f"changelog {self.name!r} has {found} partitions but the input has "
                    f"{self.partitions}; delete it or give the table another changelog topic")
        return (f"{self.kind} topic {self.name!r} has {found} partitions on {servers}, but "
                f"the app runs it with {self.partitions}: reset the app (`kasper app "
                "reset`), or declare that count")


def output_specs(config: Config, metadata: Any) -> list[TopicSpec]:
    """The declared output topics (``Config.output_topics``) as specs: created with
    ``partitions``, else the input topics' count (read from ``metadata`` only for an
    absent one); an existing one is checked against a declared count, any taken else."""
    specs = []
    for topic in config.output_topics:
        count = topic.partitions
        if count is None:
            meta = metadata.topics.get(topic.name)
            count = (partition_count(config, metadata) if topic_problem(meta) is not None
                     else len(meta.partitions))
        specs.append(TopicSpec(topic.name, "output", count,
                               "any" if topic.partitions is None else "exact",
                               topic.replication_factor or -1, dict(topic.config)))
    return specs


def leader_spec(topic: str) -> TopicSpec:
    """The leader election's topic: one partition; an existing one is used as it is
    (only its partition 0 is ever assigned as the lead)."""
    return TopicSpec(topic, "leader", 1, "any")


def changelog_spec(topic: str, partitions: int, replication_factor: int = -1,
                   config: Mapping[str, str] | None = None) -> TopicSpec:
    """A local table's changelog: compacted, one partition per input partition (an
    existing one may have more)."""
    return TopicSpec(topic, "changelog", partitions, "at_least", replication_factor,
                     {"cleanup.policy": "compact", **(config or {})})


# -- internal topics (an app's repartitions) ----------------------------------------------

def internal_specs(source_counts: Mapping[str, int], topics: Sequence[OutputTopic]
                   ) -> list[TopicSpec]:
    """An app's internal ``topics`` as specs, each with its declared partition count, or
    else the one count of the sources (``source_counts``: topic -> count; a
    ``TopicError`` when they differ), and ``REPARTITION_CONFIG`` under their own
    settings."""
    return [TopicSpec(topic.name, "internal", topic.partitions
                      if topic.partitions is not None else _sources_count(source_counts,
                                                                          topic.name),
                      "exact", topic.replication_factor or -1,
                      {**REPARTITION_CONFIG, **topic.config}) for topic in topics]


def _sources_count(source_counts: Mapping[str, int], topic: str) -> int:
    if len(set(source_counts.values())) > 1:
        listed = ", ".join(f"{t}={n}" for t, n in source_counts.items())
        raise TopicError(f"internal topic {topic!r} has no partition count of its own and "
                         f"the input topics differ ({listed}): declare one "
                         "(app.repartition(name, partitions=N))")
    return next(iter(source_counts.values()))


def internal_to_create(config: Config, source_counts: Mapping[str, int],
                       existing: Mapping[str, int], topics: Sequence[OutputTopic]
                       ) -> list[tuple[OutputTopic, int]]:
    """The internal ``topics`` to create, each with the partition count of the sources
    (``internal_specs``); an existing one (``existing``: topic -> count) with another
    count is a ``TopicError`` naming both."""
    create = []
    for topic, spec in zip(topics, internal_specs(source_counts, topics), strict=True):
        found = existing.get(topic.name)
        problem = None if found is None else spec.mismatch(found, config.bootstrap_servers)
        if problem is not None:
            raise TopicError(problem)
        if found is None:
            create.append((topic, spec.partitions))
    return create


def source_counts(config: Config, sources: Sequence[str], metadata: Any) -> dict[str, int]:
    """The partition count of each input topic of ``sources`` in ``metadata``;
    ``TopicError`` naming one that is missing."""
    counts: dict[str, int] = {}
    for topic in sources:
        meta = metadata.topics.get(topic)
        if topic_problem(meta) is not None:
            raise TopicError(f"input topic {topic!r}: {topic_problem(meta)} on "
                             f"{config.bootstrap_servers}")
        counts[topic] = len(meta.partitions)
    return counts


def check_internal_topics(config: Config, sources: Sequence[str],
                          topics: Sequence[OutputTopic], metadata: Any
                          ) -> list[tuple[OutputTopic, int]]:
    """The app's internal ``topics`` absent from ``metadata``, each with the partition
    count of the input topics ``sources``; ``TopicError`` as ``internal_to_create`` says
    (a count unlike the sources'), or naming a missing source. ``kasper run`` checks
    with it before starting, so a mismatch is a configuration error (exit 3)."""
    existing = {t.name: len(metadata.topics[t.name].partitions) for t in topics
                if topic_problem(metadata.topics.get(t.name)) is None}
    return internal_to_create(config, source_counts(config, sources, metadata), existing,
                              topics)


# -- the names of the topics kasper_py owns: made here only, so the side that writes
# one and the side that reads it can never disagree (both pass the running Config.name)

def repartition_topic(name: str, repartition: str) -> str:
    """The topic of an app's repartition ``repartition`` when it runs as ``Config.name``
    ``name`` (``kasper run --name``): ``<name>-<repartition>-repartition``."""
    return f"{name}-{repartition}-repartition"


def changelog_topic(name: str, table: str) -> str:
    """The default changelog of table ``table`` of ``Config.name`` ``name``:
    ``<name>-<table>-changelog``."""
    return f"{name}-{table}-changelog"


def leader_topic(name: str) -> str:
    """The one-partition topic whose group elects the leader of the processes of
    ``Config.name`` ``name`` (``kasper_py.loop.leader``), ``<name>-leader``; ``kasper
    app reset`` deletes it."""
    return f"{name}-leader"


def leader_group(config: Config) -> str:
    """The consumer group of that election, ``<Config.group>.leader``."""
    return f"{config.group}.leader"
