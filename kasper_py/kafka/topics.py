"""Topics checked against cluster metadata, the same way for the live loop, the CLI and
the reprocess driver. Input topics: every one exists, all have one partition count (so
partition-wise processing is possible), and the configured partitions exist. Output
topics: what a producer can tell of one from its metadata, and the declared ones
(``Config.output_topics``) checked and created at start. Topics are created here and
only here (output topics, changelogs, an app's internal topics and its leader topic).
Reading the metadata stays with each caller, whose client and unreachable-broker error
differ.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import structlog
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic  # confluent_kafka.admin re-exports it untyped

from kasper_py.config import Config, OutputTopic
from kasper_py.exceptions import TopicError
from kasper_py.kafka.client_log import with_client_log
from kasper_py.message import TopicPartitionKey

__all__ = ["changelog_topic", "check_internal_topics", "cluster_topics", "common_partition_count",
           "create_declared", "create_topics", "ensure_internal_topics", "ensure_leader_topic",
           "ensure_output_topics", "input_partitions", "internal_to_create", "leader_group",
           "leader_topic", "missing_output_topics", "owned_partitions", "partition_count",
           "repartition_topic", "topic_problem"]

_log = structlog.get_logger("kasper_py")
_TIMEOUT = 30.0
_ABSENT = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC})
_REFUSED = frozenset({KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.TOPIC_EXCEPTION})


def partition_count(config: Config, metadata: Any) -> int:
    """The input topics' one partition count, from ``list_topics()``'s ``metadata``.

    Raises ``TopicError`` naming a missing topic, or every topic's count when they differ.
    """
    counts: dict[str, int] = {}
    for topic in config.input_topics:
        meta = metadata.topics.get(topic)
        if meta is None or meta.error is not None:
            reason = "does not exist" if meta is None else meta.error.str()
            raise TopicError(f"input topic {topic!r}: {reason} on {config.bootstrap_servers}")
        counts[topic] = len(meta.partitions)
    return common_partition_count(counts)


def common_partition_count(counts: Mapping[str, int]) -> int:
    """The partition count every input topic shares (``counts``: topic -> its count);
    ``TopicError`` listing them when they differ. The in-memory broker checks with it too."""
    if len(set(counts.values())) > 1:
        listed = ", ".join(f"{t}={n}" for t, n in counts.items())
        raise TopicError("input topics must have the same partition count to be processed "
                         f"partition-wise; found {listed}")
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
    owned = owned_partitions(config, partition_count(config, metadata))
    return [(topic, p) for topic in config.input_topics for p in owned]


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


def missing_output_topics(config: Config, metadata: Any) -> list[tuple[OutputTopic, int]]:
    """The declared output topics absent from ``metadata``, each with the partition count
    to create it with (``partitions``, else the input topics' count).

    Raises ``TopicError`` naming the topic, its declared and its actual partition count
    when an existing one differs (a declaration without ``partitions`` takes any), or
    the cluster's refusal of one.
    """
    missing: list[tuple[OutputTopic, int]] = []
    for topic in config.output_topics:
        meta = metadata.topics.get(topic.name)
        problem = topic_problem(meta)
        if problem == "does not exist":
            missing.append((topic, topic.partitions or partition_count(config, metadata)))
        elif problem is not None:
            raise TopicError(f"output topic {topic.name!r}: {problem}")
        elif topic.partitions is not None and len(meta.partitions) != topic.partitions:
            raise TopicError(
                f"output topic {topic.name!r} is declared with {topic.partitions} partitions "
                f"but has {len(meta.partitions)} on {config.bootstrap_servers}: fix the "
                "declaration (Config.output_topics), or recreate the topic")
    return missing


def ensure_output_topics(config: Config, *, create: bool = True, admin: Any = None,
                         metadata: Any = None) -> list[str]:
    """Check the declared output topics (``Config.output_topics``) before a processor
    starts: with ``create``, create the absent ones with their partitions, replication
    and settings; without, an absent one is a ``TopicError``. Either way an existing one
    with another partition count is a ``TopicError`` naming both counts. Returns the
    names created.

    ``admin`` (an ``AdminClient``) and ``metadata`` (its ``list_topics()``) are built
    from ``config`` when not given; ``kasper run --create-topics`` passes its own.
    """
    if not config.output_topics:
        return []
    if admin is None:
        admin = AdminClient(with_client_log(config.to_admin_conf(), config.name, "admin"))
    if metadata is None:
        metadata = cluster_topics(admin, config)
    missing = missing_output_topics(config, metadata)
    if missing and not create:
        names = ", ".join(repr(topic.name) for topic, _ in missing)
        raise TopicError(f"declared output topics {names} do not exist on "
                         f"{config.bootstrap_servers}: create them, or start with "
                         "--create-topics (kasper_py.kafka.topics.ensure_output_topics)")
    return create_declared(admin, config, missing)


def create_declared(admin: Any, config: Config, missing: Sequence[tuple[OutputTopic, int]],
                    **logged: Any) -> list[str]:
    """Create each declared topic of ``missing`` with its partition count, replication
    and settings (``create_topics``), logging each with ``logged``; returns the names."""
    create_topics(admin, [NewTopic(topic.name, num_partitions=count,
                                   replication_factor=topic.replication_factor or -1,
                                   config=dict(topic.config)) for topic, count in missing])
    for topic, count in missing:
        _log.info("kasper.topic_created", processor=config.name, topic=topic.name,
                  partitions=count, **logged)
    return [topic.name for topic, _ in missing]


def create_topics(admin: Any, topics: Sequence[NewTopic], timeout: float = _TIMEOUT) -> None:
    """Create ``topics`` with ``admin`` (an ``AdminClient``, which must outlive the
    request) and wait for each; one that exists already (another process was first) is
    left as it is. Raises ``TopicError`` naming a topic the cluster refused, with why."""
    if not topics:
        return
    futures = admin.create_topics(list(topics), request_timeout=timeout)
    for name, future in futures.items():
        try:
            future.result(timeout + 5)  # the request times out first, with Kafka's error
        except KafkaException as exc:
            error = exc.args[0]
            if error.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise TopicError(f"cannot create topic {name!r}: {error.str()} (waited up "
                                 f"to {timeout:g}s)", code=error.code()) from exc
        except TimeoutError as exc:
            raise TopicError(f"cannot create topic {name!r}: no answer within "
                             f"{timeout + 5:g}s", code=KafkaError._TIMED_OUT) from exc


def cluster_topics(admin: Any, config: Config) -> Any:
    """Every topic's metadata, read with ``admin`` (listing them all never creates one);
    ``TopicError`` when the cluster does not answer within 30 s, with the client's
    reason."""
    try:
        return admin.list_topics(timeout=_TIMEOUT)
    except KafkaException as exc:
        admin.poll(0)  # serves the client's log lines (delivered only on poll), which say why
        raise TopicError(f"cannot read topics from {config.bootstrap_servers} within "
                         f"{_TIMEOUT:g}s: {exc.args[0]}") from exc


# -- internal topics (an app's repartitions) ----------------------------------------------

def internal_to_create(config: Config, source_counts: Mapping[str, int],
                       existing: Mapping[str, int], topics: Sequence[OutputTopic]
                       ) -> list[tuple[OutputTopic, int]]:
    """The internal ``topics`` to create, each with the partition count of the sources
    (``source_counts``: topic -> count, one count shared, else ``TopicError``); an
    existing one (``existing``: topic -> count) or a declaration with another count is a
    ``TopicError`` naming both: the loop runs partition numbers across every topic."""
    count = common_partition_count(source_counts)
    create = []
    for topic in topics:
        if topic.partitions is not None and topic.partitions != count:
            raise TopicError(f"internal topic {topic.name!r} is declared with "
                             f"{topic.partitions} partitions, but the input topics "
                             f"{list(source_counts)} have {count}: every topic an app reads "
                             "shares one partition count")
        found = existing.get(topic.name)
        if found is None:
            create.append((topic, count))
        elif found != count:
            raise TopicError(f"internal topic {topic.name!r} has {found} partitions on "
                             f"{config.bootstrap_servers}, but the input topics have "
                             f"{count}: reset the app (`kasper app reset`), or give its "
                             "inputs that count")
    return create


def check_internal_topics(config: Config, sources: Sequence[str],
                          topics: Sequence[OutputTopic], metadata: Any
                          ) -> list[tuple[OutputTopic, int]]:
    """The app's internal ``topics`` absent from ``metadata``, each with the partition
    count of the input topics ``sources``; ``TopicError`` as ``internal_to_create`` says
    (a count unlike the sources'), or naming a missing source. ``kasper run`` checks
    with it before starting, so a mismatch is a configuration error (exit 3)."""
    counts: dict[str, int] = {}
    for topic in sources:
        meta = metadata.topics.get(topic)
        if topic_problem(meta) is not None:
            raise TopicError(f"input topic {topic!r}: {topic_problem(meta)} on "
                             f"{config.bootstrap_servers}")
        counts[topic] = len(meta.partitions)
    existing = {t.name: len(metadata.topics[t.name].partitions) for t in topics
                if topic_problem(metadata.topics.get(t.name)) is None}
    return internal_to_create(config, counts, existing, topics)


def ensure_internal_topics(config: Config, sources: Sequence[str],
                           topics: Sequence[OutputTopic]) -> list[str]:
    """Create the app's internal ``topics`` that are absent, with the partition count of
    the input topics ``sources`` (``check_internal_topics``); returns the names created."""
    if not topics:
        return []
    admin = AdminClient(with_client_log(config.to_admin_conf(), config.name, "admin"))
    missing = check_internal_topics(config, sources, topics, cluster_topics(admin, config))
    created = create_declared(admin, config, missing, internal=True)
    _wait_visible(admin, config, {made.name: count for made, count in missing})
    return created


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


def ensure_leader_topic(config: Config, topic: str) -> bool:
    """Create ``topic``, the one-partition topic whose consumer group elects the leader
    of ``config.name``'s processes (``kasper_py.loop.leader``), when absent; True when
    created. An existing one is used as it is (only its partition 0 is ever assigned as
    the lead). Raises ``TopicError`` when the cluster refuses or does not answer."""
    admin = AdminClient(with_client_log(config.to_admin_conf(), config.name, "admin"))
    if topic_problem(cluster_topics(admin, config).topics.get(topic)) != "does not exist":
        return False
    create_topics(admin, [NewTopic(topic, num_partitions=1, replication_factor=-1)])
    _log.info("kasper.topic_created", processor=config.name, topic=topic, partitions=1,
              internal=True)
    return True


def _wait_visible(admin: Any, config: Config, created: Mapping[str, int]) -> None:
    """Wait until the broker's metadata shows each of the ``created`` topics with all its
    partitions. A group member subscribes right after: a topic the broker does not know
    yet is left out of its first assignment, which then holds the sources' partitions
    without their co-partitioned peers (a refused assignment). ``TopicError`` after 30 s."""
    deadline = time.monotonic() + _TIMEOUT
    while created:
        metadata = cluster_topics(admin, config)
        shown = {name for name, count in created.items()
                 if topic_problem(metadata.topics.get(name)) is None
                 and len(metadata.topics[name].partitions) == count}
        if shown == set(created):
            return
        if time.monotonic() > deadline:
            raise TopicError(f"created topics {sorted(set(created) - shown)} are not in the "
                             f"metadata of {config.bootstrap_servers} after {_TIMEOUT:.0f} s")
        time.sleep(0.1)
