"""``InMemoryBroker``: Kafka in a dict, for tests. It holds topics (partitions, offsets,
keys, values, headers, timestamps), consumer groups' committed offsets and store tables,
hands a real ``TopicProcessor`` clients bound to it, and injects ``Faults`` between the
steps of a turn. Public through ``kasper_py.testing``; no server, and nothing sleeps.
Here: the API a test calls and the broker's stores; its state is ``memory_cluster``'s,
its clients ``memory_clients``', its faults ``faults``'.

What survives a ``SimulatedCrash`` is what a real one leaves: the topic logs (acked
output), committed offsets and flushed store data. Lost with the crashed process: its
queued, unacked output, its open transaction, its consumer positions and its stores'
buffered writes.

Exactly-once (``Config.processing_guarantee``): a producer's transaction holds its
acked records until ``commit`` appends them, with the input offsets, at once; so the
logs hold committed records only (what ``read_committed`` readers see), and aborted
records and transaction markers take no offsets, unlike Kafka's logs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kasper_py.config import Config, OutputTopic
from kasper_py.exceptions import StoreError, TopicError
from kasper_py.kafka.ports import KafkaClients
from kasper_py.kafka.topics import internal_to_create
from kasper_py.message import Message, OutgoingMessage, TopicPartitionKey
from kasper_py.stores.base import StoreRuntime, StoreSpec, already_applied
from kasper_py.stores.memory import MemoryStore
from kasper_py.testing.faults import INJECTED, positive
from kasper_py.testing.memory_clients import MemoryProcess
from kasper_py.testing.memory_cluster import MemoryCluster

__all__ = ["InMemoryBroker"]


class InMemoryBroker(MemoryCluster):
    """Topics, consumer groups and store tables in memory, shared by every
    ``TopicProcessor`` built with ``clients(config)``, so a test can crash one, start a
    fresh one on the same broker and assert on what a restarted process would see.

    Topics are not created on demand: producing to an unknown topic fails, as it does on
    clusters with ``auto.create.topics.enable=false`` (typos show up in tests).
    Partitioning: an explicit partition wins; keyed messages go to
    ``(murmur2(key) & 0x7fffffff) % partitions``, where the Java client and the loop's
    producer put them; messages without a key go round-robin per topic.
    """

    # -- topics ----------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int = 1) -> None:
        """Create topic ``name`` with ``partitions`` empty partitions."""
        positive("partitions", partitions)
        with self._lock:
            if name in self._logs:
                raise TopicError(f"topic {name!r} already exists")
            self._logs[name] = [[] for _ in range(partitions)]

    def produce(self, topic: str, value: bytes | str | None, key: bytes | str | None = None,
                *, partition: int | None = None,
                headers: Iterable[tuple[str, bytes | None]] = (),
                timestamp: int | None = None) -> Message:
        """Append test input at once (acked); ``str`` key and value are encoded as UTF-8,
        ``timestamp`` (ms, its create time) defaults to now. Returns the message as stored,
        offset included."""
        message = OutgoingMessage(topic, _utf8(value), _utf8(key), partition, tuple(headers),
                                  timestamp)
        return self._append(self._route(message), message)

    def read(self, topic: str, partition: int | None = None) -> list[Message]:
        """What the log of ``topic`` holds (one partition's, or every partition's in
        partition order), keys and values as bytes."""
        with self._lock:
            partitions = self._partitions(topic)
            chosen = range(len(partitions)) if partition is None else [partition]
            return [m for p in chosen for m in partitions[p]]

    # -- processes and stores --------------------------------------------------------

    def clients(self, config: Config) -> KafkaClients:
        """A consumer and a producer for one process running ``config``, bound to this
        broker, with the faults' crash hook; pass them as ``TopicProcessor(clients=...)``."""
        process = MemoryProcess(self, config)
        return KafkaClients(process.consumer, process.producer, process.on_step, self.clock,
                            self.wall_clock, self.ensure_topics)

    def ensure_topics(self, config: Config, sources: Sequence[str],
                      topics: Sequence[OutputTopic]) -> list[str]:
        """``KafkaClients.ensure_topics``: create an app's absent internal ``topics``
        with the partition count of ``sources``, as the cluster's admin does."""
        counts = {}
        for topic in sources:
            count = self._partition_count(topic)
            if count is None:
                raise TopicError(f"input topic {topic!r}: does not exist on the in-memory "
                                 "broker")
            counts[topic] = count
        existing = {t.name: n for t in topics if (n := self._partition_count(t.name))}
        missing = internal_to_create(config, counts, existing, topics)
        for made, count in missing:
            self.create_topic(made.name, count)
        return [made.name for made, _ in missing]

    def store(self, name: str, *, effectively_once: bool = False) -> StoreSpec:
        """A key-value table ``name`` whose flushed data lives in the broker (like a Redis
        server's), so it outlives a crashed process; buffered writes die with it. With
        ``effectively_once``, each flush also records the partition's next input offsets
        atomically with the data, and replayed input below them is skipped."""
        return _BrokerTable(self, name, effectively_once)

    def table(self, name: str, partition: int | None = None) -> dict[Any, Any]:
        """The flushed data of table ``name``: one partition's, or every partition's
        merged (a key in two partitions: the higher partition's value)."""
        with self._lock:
            found = sorted((p, data) for (table, p), data in self._tables.items()
                           if table == name and (partition is None or p == partition))
            return {k: v for _, data in found for k, v in data.items()}


def _utf8(data: bytes | str | None) -> bytes | None:
    return data.encode() if isinstance(data, str) else data


# -- stores -----------------------------------------------------------------------------


class _BrokerTable(StoreSpec):
    """``InMemoryBroker.store``: opens one ``_BrokerStore`` per partition."""

    def __init__(self, broker: InMemoryBroker, name: str, effectively_once: bool) -> None:
        self.name = name
        self.effectively_once = effectively_once
        self._broker = broker

    def open(self, runtime: StoreRuntime) -> _BrokerStore:
        """A fresh view of partition ``runtime.partition``'s data in the broker."""
        return _BrokerStore(self._broker, self, runtime.partition)


class _BrokerStore(MemoryStore):
    """A ``MemoryStore`` whose flushed dict is the broker's, so it outlives the process;
    its buffered writes belong to the process and die with it."""

    def __init__(self, broker: InMemoryBroker, table: _BrokerTable, partition: int) -> None:
        super().__init__()
        self.effectively_once = table.effectively_once
        self._broker, self._name, self._partition = broker, table.name, partition
        with broker._lock:
            self.data = broker._tables.setdefault((table.name, partition), {})
            self._applied = broker._applied.setdefault((table.name, partition), {})

    def flush(self, next_offsets: Mapping[TopicPartitionKey, int]) -> None:
        """Apply the buffered writes (and, effectively-once, record ``next_offsets``
        with them, all or nothing); a replayed batch's writes are dropped."""
        recording = self.effectively_once and bool(next_offsets)
        if recording and already_applied(self._applied, next_offsets):
            self.discard_pending()
            return
        if (self._pending or recording) and self._broker.faults._fires(f"store:{self._name}"):
            raise StoreError(f"store {self._name!r} of partition {self._partition}: "
                             f"write failed: {INJECTED}")
        with self._broker._lock:
            super().flush(next_offsets)
            if recording:
                self._applied.update(next_offsets)

    def applied_offsets(self) -> Mapping[TopicPartitionKey, int]:
        """Next input offsets this partition's data already holds (effectively-once)."""
        return dict(self._applied)
