"""What the driver asks Kafka before and after a job: input partitions and their
watermarks, offsets for a time, the live group's state and committed offsets, and the
handoff commit. Kafka's exceptions become ``ReprocessError`` here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from kasper_py._client_log import with_client_log
from kasper_py.config import Config
from kasper_py.exceptions import ReprocessError
from kasper_py.offsets import CommitNote
from kasper_py.topics import input_partitions

__all__ = ["BrokerUnreachableError", "KafkaFacts"]

TopicPartitionKey = tuple[str, int]

_UNREACHABLE = (KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN,
                KafkaError._RESOLVE)


class BrokerUnreachableError(ReprocessError):
    """Kafka did not answer the driver's requests in time."""


class KafkaFacts:
    """A short-lived consumer (in the live group, never subscribing) and admin client."""

    def __init__(self, config: Config, timeout: float = 30.0) -> None:
        self._config = config
        self._timeout = timeout
        self._errors: list[str] = []
        # Quiet librdkafka: the first error it reports goes into the exception instead;
        # what it still logs goes into the JSON log.
        quiet: dict[str, Any] = {"log_level": 2, "error_cb": self._on_error}
        self._consumer = Consumer(with_client_log(
            {**config.to_consumer_conf(), **quiet, "client.id": f"{config.name}-reprocess"},
            config.name, "consumer"))
        self._admin = AdminClient(with_client_log({**config.to_admin_conf(), **quiet},
                                                  config.name, "admin"))

    def input_keys(self) -> list[TopicPartitionKey]:
        """Every (topic, partition) to reprocess; ``TopicError`` as for the live loop when
        a topic is missing, the counts differ or an ``input_partitions`` is missing."""
        metadata = self._call("reading metadata", self._consumer.list_topics,
                              timeout=self._timeout)
        return input_partitions(self._config, metadata)

    def watermarks(self, keys: Iterable[TopicPartitionKey]) -> dict[TopicPartitionKey,
                                                                   tuple[int, int]]:
        """(low, high) per partition; high is the last stable offset under read_committed."""
        found = {}
        for topic, partition in keys:
            low, high = self._call(f"reading the watermarks of {topic}[{partition}]",
                                   self._consumer.get_watermark_offsets,
                                   TopicPartition(topic, partition), timeout=self._timeout)
            found[topic, partition] = (int(low), int(high))
        return found

    def offsets_at(self, millis: int, watermarks: Mapping[TopicPartitionKey, tuple[int, int]]
                   ) -> dict[TopicPartitionKey, int]:
        """First offset at or after ``millis`` per partition; the high watermark where
        every message is older (and where records arrived after the watermarks were
        read: the range ends at that snapshot). A partition the lookup failed for is a
        ``ReprocessError``, not "no message that recent"."""
        request = [TopicPartition(t, p, millis) for t, p in sorted(watermarks)]
        found = self._call(f"finding the offsets at {millis} ms", self._consumer.offsets_for_times,
                           request, timeout=self._timeout)
        failed = [f"{tp.topic}[{tp.partition}]: {tp.error.str()}" for tp in found
                  if tp.error is not None]
        if failed:
            raise ReprocessError(f"finding the offsets at {millis} ms failed for "
                                 f"{'; '.join(failed)}")
        return {(tp.topic, tp.partition):
                min(tp.offset, watermarks[tp.topic, tp.partition][1]) if tp.offset >= 0
                else watermarks[tp.topic, tp.partition][1] for tp in found}

    def committed(self, keys: Iterable[TopicPartitionKey]) -> dict[TopicPartitionKey, int | None]:
        """The live group's committed next offsets (``None`` where nothing is committed)."""
        request = [TopicPartition(t, p) for t, p in keys]
        found = self._call(f"reading the offsets of group {self._config.group!r}",
                           self._consumer.committed, request, timeout=self._timeout)
        return {(tp.topic, tp.partition): tp.offset if tp.offset >= 0 else None for tp in found}

    def commit_notes(self, keys: Iterable[TopicPartitionKey]) -> list[CommitNote | None]:
        """The kasper loop notes stored with the live group's committed offsets."""
        request = [TopicPartition(t, p) for t, p in keys]
        found = self._call(f"reading the offsets of group {self._config.group!r}",
                           self._consumer.committed, request, timeout=self._timeout)
        return [CommitNote.decode(tp.metadata) for tp in found]

    def group_state(self) -> tuple[str, list[str]]:
        """The live group's state (``EMPTY``, ``STABLE``...) and its members' client ids."""
        group = self._config.group
        futures = self._admin.describe_consumer_groups([group], request_timeout=self._timeout)
        description = self._call(f"describing group {group!r}", futures[group].result,
                                 timeout=self._timeout + 5)
        return description.state.name, [m.client_id for m in description.members]

    def commit(self, offsets: Mapping[TopicPartitionKey, int], note: str | None = None
               ) -> None:
        """Set the live group's committed offsets, with ``note`` as their metadata (the
        broker refuses while the group has members)."""
        group = self._config.group
        request = ConsumerGroupTopicPartitions(
            group, [TopicPartition(t, p, o) if note is None
                    else TopicPartition(t, p, o, metadata=note)
                    for (t, p), o in sorted(offsets.items())])
        futures = self._admin.alter_consumer_group_offsets([request],
                                                           request_timeout=self._timeout)
        result = self._call(f"committing the offsets of group {group!r}",
                            futures[group].result, timeout=self._timeout + 5)
        failed = [f"{tp.topic}[{tp.partition}]: {tp.error.str()}"
                  for tp in result.topic_partitions if tp.error is not None]
        if failed:
            raise ReprocessError(f"committing the offsets of group {group!r} failed "
                                 f"for {'; '.join(failed)}")

    def close(self) -> None:
        """Close the consumer (it never joined the group, so nothing rebalances)."""
        self._consumer.close()

    def _on_error(self, error: Any) -> None:
        self._errors.append(error.str())

    def _call(self, what: str, method: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else exc
            text = error.str() if hasattr(error, "str") else str(error)
            cause = f" ({self._errors[0]})" if self._errors else ""
            code = _code(error)
            kind = BrokerUnreachableError if code in _UNREACHABLE else ReprocessError
            raise kind(f"{what} on {self._config.bootstrap_servers} failed: {text}{cause}",
                       code=code) from exc


def _code(error: Any) -> int | None:
    code = error.code() if hasattr(error, "code") else None
    return code if isinstance(code, int) else None
