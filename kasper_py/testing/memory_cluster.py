"""``MemoryCluster``: what an ``InMemoryBroker`` holds (topic logs, consumer groups'
commits, transactional ids' epochs, store tables, its clock and its ``Faults``) and the
operations its clients (``memory_clients``) and stores perform on it, under one lock.
``InMemoryBroker`` (``memory``) adds the API a test calls.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

from confluent_kafka import KafkaError

from kasper_py.exceptions import ConsumeError, ProduceError, TopicError
from kasper_py.kafka.partitioner import murmur2_partition
from kasper_py.message import TIMESTAMP_CREATE_TIME, Message, OutgoingMessage, TopicPartitionKey
from kasper_py.testing.faults import Faults

__all__ = ["Commit", "MemoryCluster", "Owner", "Queued"]

_IDLE_PAUSE = 0.001  # a consume that finds nothing yields, so an idle loop does not spin


class Commit(NamedTuple):
    """One committed offset, as ``InMemoryBroker.commits`` lists them."""

    topic: str
    partition: int
    offset: int
    """The next offset to read."""
    metadata: str | None
    """The loop's ``CommitNote`` (``kasper_py.kafka.offsets.CommitNote.decode`` reads it)."""


@dataclass
class Queued:
    """A message handed to a producer, routed, waiting for its ack."""

    partition: int
    message: OutgoingMessage
    """Its ``timestamp`` set: the producer stamps an unstamped message when it is sent."""
    fails: bool


class Owner(NamedTuple):
    """A transactional id and the epoch a producer took it over at."""

    transactional_id: str
    epoch: int


class MemoryCluster:
    """The state an ``InMemoryBroker`` shares between the processes bound to it."""

    def __init__(self) -> None:
        self.faults = Faults()
        self._lock = threading.RLock()
        self._logs: dict[str, list[list[Message]]] = {}
        self._round_robin: dict[str, int] = {}
        self._commits: dict[str, list[Commit]] = {}
        self._tables: dict[TopicPartitionKey, dict[Any, Any]] = {}
        self._applied: dict[TopicPartitionKey, dict[TopicPartitionKey, int]] = {}
        self._epochs: dict[str, int] = {}
        self._now = 0.0
        self._started = time.time()

    def watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        """(low, high) offsets of one partition; nothing is ever deleted, so low is 0."""
        with self._lock:
            partitions = self._logs.get(topic)
            if partitions is None or not 0 <= partition < len(partitions):
                raise ConsumeError(f"watermarks of {topic}[{partition}]: "
                                   f"{KafkaError(KafkaError._UNKNOWN_PARTITION).str()}",
                                   code=KafkaError._UNKNOWN_PARTITION)
            return 0, len(partitions[partition])

    # -- consumer groups -------------------------------------------------------------

    def committed(self, group: str) -> dict[TopicPartitionKey, int]:
        """The next offset to read that ``group`` committed last, per topic-partition."""
        return {(c.topic, c.partition): c.offset for c in self.commits(group)}

    def commits(self, group: str) -> list[Commit]:
        """Every offset ``group`` committed, oldest first, with its metadata."""
        with self._lock:
            return list(self._commits.get(group, ()))

    def clock(self) -> float:
        """Seconds on the broker's clock, on which a loop measures ``batch_wait``: a
        consume that finds fewer records than asked moves it on by its timeout, as if
        the wait had passed, so batches close at once."""
        return self._now

    def wall_clock(self) -> float:
        """Seconds since the epoch on which a loop runs wall-clock timers and tasks: the
        wall time this broker was made at, moved on with ``clock``, so an idle loop
        reaches a due timer without sleeping."""
        return self._started + self._now

    # -- for the clients and stores --------------------------------------------------

    def _partitions(self, topic: str) -> list[list[Message]]:
        partitions = self._logs.get(topic)
        if partitions is None:
            raise TopicError(f"topic {topic!r} does not exist")
        return partitions

    def _partition_count(self, topic: str) -> int | None:
        with self._lock:
            partitions = self._logs.get(topic)
            return None if partitions is None else len(partitions)

    def _route(self, message: OutgoingMessage) -> int:
        """The partition ``message`` goes to; ``ProduceError`` (as the producer words it)
        for an unknown topic or partition."""
        count = self._partition_count(message.topic)
        code = KafkaError._UNKNOWN_TOPIC if count is None else KafkaError._UNKNOWN_PARTITION
        if count is None or (message.partition is not None
                             and not 0 <= message.partition < count):
            raise ProduceError(f"cannot produce to {message.topic!r}: {KafkaError(code).str()}",
                               code=code)
        if message.partition is not None:
            return message.partition
        if message.key is not None:
            return murmur2_partition(message.key, count)
        with self._lock:
            turn = self._round_robin.get(message.topic, 0)
            self._round_robin[message.topic] = turn + 1
        return turn % count

    def _append(self, partition: int, message: OutgoingMessage) -> Message:
        """Append ``message`` with its create time (``timestamp``, else now), as a broker
        keeps a producer's."""
        timestamp = message.timestamp
        with self._lock:
            log = self._partitions(message.topic)[partition]
            stored = Message(message.topic, partition, len(log), message.key, message.value,
                             int(time.time() * 1000) if timestamp is None else timestamp,
                             message.headers or (), TIMESTAMP_CREATE_TIME)
            log.append(stored)
            return stored

    def _fetch(self, tp: TopicPartitionKey, offset: int, max_count: int) -> list[Message]:
        with self._lock:
            return self._partitions(tp[0])[tp[1]][offset:offset + max_count]

    def _commit(self, group: str, commits: list[Commit]) -> None:
        with self._lock:
            self._commits.setdefault(group, []).extend(commits)

    def _take_over(self, transactional_id: str) -> Owner:
        """``init_transactions``: the id's next epoch, which fences every older one."""
        with self._lock:
            epoch = self._epochs.get(transactional_id, 0) + 1
            self._epochs[transactional_id] = epoch
            return Owner(transactional_id, epoch)

    def _holds(self, owner: Owner) -> bool:
        """True while no newer producer took over ``owner``'s transactional id."""
        with self._lock:
            return self._epochs.get(owner.transactional_id) == owner.epoch

    def _commit_transaction(self, owner: Owner, records: list[Queued], group: str,
                            commits: list[Commit]) -> bool:
        """Append ``records`` and commit ``commits`` for ``group``, all at once; False
        (nothing done) when ``owner`` was fenced."""
        with self._lock:
            if not self._holds(owner):
                return False
            for record in records:
                self._append(record.partition, record.message)
            self._commit(group, commits)
            return True

    def _wait(self, timeout: float, idle: bool) -> None:
        self._now += timeout
        if idle:
            time.sleep(min(timeout, _IDLE_PAUSE))
