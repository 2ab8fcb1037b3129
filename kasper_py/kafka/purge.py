"""Purging an app's repartition topics. They keep their records by time forever
(``topics.REPARTITION_CONFIG``), so what the downstream stage has read and committed
is deleted here instead, up to the offsets this process committed, at most once per
``Config.repartition_purge_interval`` (Kafka Streams' ``repartition.purge.interval.ms``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Protocol

import structlog

from kasper_py.config import Config, OutputTopic
from kasper_py.exceptions import KasperError
from kasper_py.kafka.admin import topic_admin
from kasper_py.message import TopicPartitionKey

__all__ = ["RecordDeleter", "RepartitionPurge", "purge_for"]

_log = structlog.get_logger("kasper_py")


class RecordDeleter(Protocol):
    """Deletes a partition's records before an offset (``KafkaAdmin.delete_records``)."""

    def delete_records(self, offsets: Mapping[TopicPartitionKey, int]
                       ) -> dict[TopicPartitionKey, int]:
        """Delete the records before each offset; each partition's low watermark after."""


class RepartitionPurge:
    """Deletes the records of ``topics`` (the repartitions) that this process committed,
    called after each successful commit with the offsets committed so far. Only
    committed offsets are purged: a record below one was processed, its effects flushed
    and acknowledged; what lies at or after it is kept for a replay. A failed purge is
    logged and tried again at the next interval: the records stay, nothing is lost."""

    def __init__(self, name: str, topics: Collection[str], deleter: Callable[[], RecordDeleter],
                 *, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        """``deleter`` makes the admin on first purge (none is made for a processor
        without repartitions)."""
        self._name, self._topics, self._deleter = name, frozenset(topics), deleter
        self._interval, self._clock = interval, clock
        self._last = clock()
        self._purged: dict[TopicPartitionKey, int] = {}
        """The offsets purged up to, per partition: never asked for twice."""

    def due(self) -> bool:
        """Whether the next ``after_commit`` would purge: there are repartitions, and
        the interval has passed since the last purge (one clock read; no offsets)."""
        return bool(self._topics) and self._clock() - self._last >= self._interval

    def after_commit(self, committed: Mapping[TopicPartitionKey, int]) -> None:
        """Purge ``committed`` (the next offsets committed per topic-partition) of the
        repartition topics when the interval has passed since the last purge."""
        if not self.due():
            return
        self._last = self._clock()
        due = {key: offset for key, offset in committed.items()
               if key[0] in self._topics and offset > self._purged.get(key, 0)}
        if not due:
            return
        try:
            self._deleter().delete_records(due)
        except KasperError as exc:
            _log.warning("kasper.repartition_purge_failed", processor=self._name,
                         error=str(exc))
            return
        self._purged.update(due)
        _log.debug("kasper.repartition_purged", processor=self._name,
                   partitions=len(due), records_before=sum(due.values()))


def purge_for(config: Config, internal: Sequence[OutputTopic]) -> RepartitionPurge:
    """The purge of ``internal`` (an app's repartition topics; none for a lone processor,
    or on the in-memory broker) through the process's topic admin."""
    return RepartitionPurge(config.name, [topic.name for topic in internal],
                            lambda: topic_admin(config),
                            interval=config.repartition_purge_interval)
