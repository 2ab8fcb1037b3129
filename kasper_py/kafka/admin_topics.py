"""The topic half of ``KafkaAdmin``: ``ensure`` creates, awaits and checks every kind of
topic kasper_py owns or is told to create (``topics.TopicSpec``: output, internal,
leader, changelog); ``delete_records`` purges what a group has committed; ``kasper app
reset`` deletes topics. Reading group offsets and watermarks stays in ``admin``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import structlog
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported untyped
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    ResourceType,
)
from confluent_kafka.cimpl import NewTopic  # confluent_kafka.admin re-exports it untyped

from kasper_py.exceptions import KasperError, TopicError
from kasper_py.kafka.topics import TopicSpec, topic_problem
from kasper_py.message import TopicPartitionKey

__all__ = ["TopicAdmin"]

_log = structlog.get_logger("kasper_py")


class TopicAdmin:
    """Topic requests over an ``AdminClient`` (``_admin``); mixed into ``KafkaAdmin``,
    which provides ``_call``, ``metadata``, ``_config``, ``_timeout`` and ``_failure``."""

    _admin: Any
    _config: Any
    _timeout: float
    _failure: type[KasperError]

    def metadata(self, topic: str | None = None) -> Any:
        raise NotImplementedError

    def _call(self, what: str, method: Any, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def ensure(self, specs: Sequence[TopicSpec], *, create: bool = True,
               metadata: Any = None) -> list[str]:
        """Every topic of ``specs`` there and as specified; returns the names of those
        that were absent (created, by this call or by a process that was first).

        1. Read the metadata (or take ``metadata``, a ``metadata()`` already read).
        2. Check each existing topic's partition count (``TopicSpec.mismatch``).
        3. Create the absent ones with ``create``, else refuse naming them; wait until
           the metadata shows them. One another process created first is checked as 2.
        4. Check settings of existing ones: a changelog must be compacted; an internal
           topic kept by time (``retention.ms``) is altered to ``REPARTITION_CONFIG``'s.

        Raises ``TopicError`` naming the topic and what is wrong with it.
        """
        if not specs:
            return []
        absent = self._absent(specs, metadata if metadata is not None else self.metadata())
        if absent and not create:
            names = ", ".join(repr(spec.name) for spec in absent)
            raise TopicError(f"declared {absent[0].kind} topics {names} do not exist on "
                             f"{self._config.bootstrap_servers}: create them, or start with "
                             "--create-topics (kasper_py.kafka.admin.ensure_output_topics)")
        existed = self._create(absent)
        raced = [spec for spec in absent if spec.name in existed]
        if raced:
            self._absent(raced, self.metadata())
        self._check_settings([spec for spec in specs if spec not in absent or spec in raced])
        return [spec.name for spec in absent]

    def _absent(self, specs: Sequence[TopicSpec], metadata: Any) -> list[TopicSpec]:
        """The specs absent from ``metadata``; ``TopicError`` for an existing one with
        the wrong partition count, or one the cluster refuses to describe."""
        absent = []
        for spec in specs:
            meta = metadata.topics.get(spec.name)
            problem = topic_problem(meta)
            if problem == "does not exist":
                absent.append(spec)
                continue
            if problem is None:
                problem = spec.mismatch(len(meta.partitions), self._config.bootstrap_servers)
            else:
                problem = f"{spec.kind} topic {spec.name!r}: {problem}"
            if problem is not None:
                raise TopicError(problem)
        return absent

    def _create(self, specs: Sequence[TopicSpec]) -> set[str]:
        """Create ``specs`` and wait for each, then for the metadata to list them all;
        returns the names another process had created first."""
        if not specs:
            return set()
        futures = self._admin.create_topics(
            [NewTopic(s.name, num_partitions=s.partitions,
                      replication_factor=s.replication_factor, config=dict(s.config))
             for s in specs], request_timeout=self._timeout)
        raced = {name for name, future in futures.items() if not self._created(name, future)}
        for spec in specs:
            if spec.name not in raced:
                _log.info("kasper.topic_created", processor=self._config.name,
                          topic=spec.name, partitions=spec.partitions, kind=spec.kind)
        self._wait_visible({spec.name: None if spec.name in raced or spec.partitions < 1
                            else spec.partitions for spec in specs})
        return raced

    def _created(self, name: str, future: Any) -> bool:
        """Wait for the creation of ``name``: True when made, False when it existed."""
        try:
            future.result(self._timeout + 5)  # the request times out first, with its error
        except KafkaException as exc:
            error = exc.args[0]
            if error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                return False
            raise TopicError(f"cannot create topic {name!r}: {error.str()} (waited "
                             f"up to {self._timeout:g}s)", code=error.code()) from exc
        except TimeoutError as exc:
            raise TopicError(f"cannot create topic {name!r}: no answer within "
                             f"{self._timeout + 5:g}s", code=KafkaError._TIMED_OUT) from exc
        return True

    def _wait_visible(self, created: Mapping[str, int | None]) -> None:
        """Wait until the metadata shows each of the ``created`` topics with all its
        partitions (``None``: any count). A group member subscribes right after: a topic
        the broker does not know yet is left out of its first assignment, which then
        holds the sources' partitions without their co-partitioned peers."""
        deadline = time.monotonic() + self._timeout
        while True:
            topics = self.metadata().topics
            shown = {name for name, count in created.items()
                     if topic_problem(topics.get(name)) is None
                     and count in (None, len(topics[name].partitions))}
            if shown == set(created):
                return
            if time.monotonic() > deadline:
                raise TopicError(f"created topics {sorted(set(created) - shown)} are not in "
                                 f"the metadata of {self._config.bootstrap_servers} after "
                                 f"{self._timeout:g} s")
            time.sleep(0.1)

    def _check_settings(self, specs: Sequence[TopicSpec]) -> None:
        """A changelog created elsewhere without compaction would lose keys on restore: a
        ``TopicError`` naming the fix. An internal topic made before repartitions kept
        their records (retention by time) is altered to keep them."""
        specs = [spec for spec in specs if spec.kind in ("changelog", "internal")]
        if not specs:
            return
        found = self.topic_configs([spec.name for spec in specs])
        for spec in specs:
            policy = found[spec.name].get("cleanup.policy", "delete")
            compacted = "compact" in spec.config.get("cleanup.policy", "")
            if spec.kind == "changelog" and compacted and "compact" not in policy:
                raise TopicError(
                    f"changelog {spec.name!r} has cleanup.policy={policy}: a changelog must "
                    "be compacted, or a restore loses keys; alter it to "
                    "cleanup.policy=compact, or delete it and let kasper_py create it")
            wanted = spec.config.get("retention.ms")
            if spec.kind == "internal" and wanted is not None and "delete" in policy \
                    and found[spec.name].get("retention.ms") != wanted:
                self.alter_topic_config(spec.name, {"retention.ms": wanted})
                _log.warning("kasper.topic_altered", processor=self._config.name,
                             topic=spec.name, setting="retention.ms", value=wanted,
                             was=found[spec.name].get("retention.ms"))

    def topic_configs(self, names: Iterable[str]) -> dict[str, dict[str, str]]:
        """Each topic's settings as the broker reports them (``DescribeConfigs``)."""
        resources = [ConfigResource(ResourceType.TOPIC, name) for name in names]
        futures = self._admin.describe_configs(resources, request_timeout=self._timeout)
        return {resource.name: {key: entry.value for key, entry in self._call(
                    f"reading the settings of topic {resource.name!r}", future.result,
                    timeout=self._timeout + 5).items()}
                for resource, future in futures.items()}

    def topic_overrides(self, name: str) -> dict[str, str]:
        """The settings topic ``name`` has of its own, not the broker's defaults
        (``DescribeConfigs``, source ``DYNAMIC_TOPIC_CONFIG``): ``kasper topics describe``."""
        future = self._admin.describe_configs([ConfigResource(ResourceType.TOPIC, name)],
                                              request_timeout=self._timeout)
        entries = self._call(f"reading the settings of topic {name!r}",
                             next(iter(future.values())).result, timeout=self._timeout + 5)
        return {key: entry.value for key, entry in sorted(entries.items())
                if entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value}

    def alter_topic_config(self, name: str, settings: Mapping[str, str]) -> None:
        """Set ``settings`` on topic ``name``, leaving its others (``IncrementalAlterConfigs``)."""
        entries = [ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)
                   for key, value in settings.items()]
        futures = self._admin.incremental_alter_configs(
            [ConfigResource(ResourceType.TOPIC, name, incremental_configs=entries)],
            request_timeout=self._timeout)
        for future in futures.values():
            self._call(f"altering the settings of topic {name!r}", future.result,
                       timeout=self._timeout + 5)

    def delete_records(self, offsets: Mapping[TopicPartitionKey, int]
                       ) -> dict[TopicPartitionKey, int]:
        """Delete the records before each offset (``DeleteRecords``); returns each
        partition's low watermark after it."""
        if not offsets:
            return {}
        request = [TopicPartition(t, p, o) for (t, p), o in sorted(offsets.items())]
        futures = self._admin.delete_records(request, request_timeout=self._timeout)
        return {(tp.topic, tp.partition): int(self._call(
                    f"deleting the records of {tp.topic}[{tp.partition}] before {tp.offset}",
                    future.result, timeout=self._timeout + 5).low_watermark)
                for tp, future in futures.items()}

    def delete_topics(self, topics: Iterable[str]) -> list[str]:
        """Delete ``topics`` (``kasper app reset``: an app's internal topics) and wait
        for each; returns those deleted, leaving out one that did not exist."""
        names = list(topics)
        if not names:
            return []
        futures = self._admin.delete_topics(names, request_timeout=self._timeout)
        deleted = []
        for name in names:
            try:
                self._call(f"deleting topic {name!r}", futures[name].result,
                           timeout=self._timeout + 5)
            except KasperError as exc:
                if exc.code != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise
                continue
            deleted.append(name)
        self._wait_gone(deleted)
        return deleted

    def _wait_gone(self, topics: list[str]) -> None:
        """Wait until the metadata lists none of ``topics``: a deletion is acknowledged
        before every broker has forgotten the topic, and creating it again meanwhile
        fails (or finds the old one)."""
        deadline = time.monotonic() + self._timeout
        while topics:
            listed = self.metadata().topics
            if not any(name in listed for name in topics):
                return
            if time.monotonic() > deadline:
                raise self._failure(f"topics {topics} still listed {self._timeout:g}s "
                                    "after their deletion")
            time.sleep(0.2)
