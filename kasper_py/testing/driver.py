"""``ProcessorDriver``: lists of messages in, what the processor sent out, with no
broker; its wall clock and stream time move only when the test says. It runs the
loop's own turn (``kasper_py.turn``), so a processor that passes here behaves the same
way inside ``TopicProcessor``. ``make_message`` builds its input.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

from kasper_py._support.closing import close_all
from kasper_py.app import App, RunTarget, plan_for
from kasper_py.config import Config
from kasper_py.kafka.batching import Batch, decode_batch
from kasper_py.kafka.partitioner import murmur2_partition
from kasper_py.message import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_NONE,
    Headers,
    Message,
    OutgoingMessage,
    OutgoingRecord,
    TopicPartitionKey,
)
from kasper_py.output_topic import value_serdes
from kasper_py.processor import MessageProcessor, ProcessorFactory
from kasper_py.serdes import Serde, serde_for
from kasper_py.stores.base import KeyValueStore, StoreRuntime, StoreSpec
from kasper_py.testing.changelog import MemoryChangelogs
from kasper_py.time import Task
from kasper_py.turn import TurnEngine

__all__ = ["ProcessorDriver", "make_message"]

_MAX_HOPS = 100
_AS_GIVEN = serde_for("bytes")  # messages handed in already decoded are not decoded again


def make_message(
    topic: str,
    value: Any,
    key: Any = None,
    *,
    partition: int = 0,
    offset: int | None = None,
    timestamp: int | None = None,
    headers: Headers = (),
    timestamp_type: int | None = None,
) -> Message:
    """A ``Message`` as a processor would receive it (key and value already decoded).

    With ``offset=None`` the driver numbers messages per topic-partition from 0.
    ``timestamp_type`` defaults to create time when ``timestamp`` is given, else none.
    """
    if timestamp_type is None:
        timestamp_type = TIMESTAMP_NONE if timestamp is None else TIMESTAMP_CREATE_TIME
    return Message(topic, partition, -1 if offset is None else offset, key, value,
                   timestamp, headers, timestamp_type)


class ProcessorDriver:
    """Runs a processor factory over batches in memory and records what it sent.

    Time moves only when the test moves it: the wall clock starts at
    ``wall_clock_start`` (seconds since the epoch; now by default) and stands still
    until ``advance_wall_clock``; a partition's stream time moves with the event times
    of the messages processed, or with ``advance_stream_time``. ``tasks`` run on the
    driver's wall clock, as ``TopicProcessor(tasks=...)`` runs them on the real one.

    An ``App`` runs as the loop runs it: what its processors send to a repartition is
    read back in the next turn (on the partition its key hashes to among
    ``partitions``), until no turn sends to one; ``outputs()`` shows the repartition
    topics too. With no ``config``, the app's name and sources make one.

    A ``RocksDBTable`` with a changelog writes it to ``changelogs`` (in memory, not in
    ``sent``) and restores from it when its files are missing: a second driver given
    ``changelogs=first.changelogs`` and another ``state_dir`` starts where the first
    left off, as a loop restarted on another machine does.
    """

    def __init__(
        self,
        factory: ProcessorFactory | App,
        *,
        config: Config | None = None,
        stores: Sequence[StoreSpec] = (),
        key_serde: str | Serde = "bytes",
        value_serde: str | Serde = "bytes",
        tasks: Sequence[Task] = (),
        wall_clock_start: float | None = None,
        partitions: int = 1,
        changelogs: MemoryChangelogs | None = None,
    ) -> None:
        app = RunTarget.of(factory).app
        config = config or Config(
            name=app.name if app else "testing", bootstrap_servers="in-memory:0",
            input_topics=app.sources if app else ("input",), key_serde=key_serde,
            value_serde=value_serde)
        plan = plan_for(factory, config, stores=stores, tasks=tasks)
        self.config, self._factory, self._store_specs = plan.config, plan.factory, plan.stores
        self._internal = {topic.name for topic in plan.internal}
        self._partitions = partitions
        if plan.routes is not None:  # read back on ``partitions`` partitions
            plan.routes.know_counts(dict.fromkeys(self._internal, partitions))
        self.changelogs = changelogs if changelogs is not None else MemoryChangelogs()
        """The local tables' changelog topics (kept out of ``sent``): pass them to a new
        driver with a fresh ``state_dir`` to restart on another machine."""
        self._port = _AckedList(self.changelogs, [
            topic for spec in self._store_specs for topic in spec.owned_state(self.config).topics],
            self._wall_clock)
        self._wall_time = time.time() if wall_clock_start is None else float(wall_clock_start)
        exactly_once = self.config.exactly_once
        self._engine = TurnEngine(self.config, self._port,
                                  commit=self._port.commit if exactly_once else None,
                                  transactions=self._port if exactly_once else None,
                                  wall_clock=self._wall_clock, tasks=plan.tasks,
                                  routes=plan.routes)
        self._next_offset: dict[TopicPartitionKey, int] = {}
        self.committed: dict[TopicPartitionKey, int] = {}
        """Next offset per (topic, partition), as the loop would commit it."""

    @property
    def sent(self) -> list[OutgoingMessage]:
        """Every message produced and acked (exactly-once: committed), in order; a failed
        turn's output is not, unless an effectively-once store had it acked (committed)
        before its flush, as the loop does."""
        return self._port.acked

    def process(self, messages: Iterable[Message], *, encoded: bool = False
                ) -> list[OutgoingMessage]:
        """Run one turn over ``messages``; return what it sent.

        Messages carry decoded keys and values, or with ``encoded=True`` the bytes as
        read from Kafka, decoded by the loop's decoder (so ``Config.on_decode_error``
        applies). A processor that raises gets a ``ProcessingError``, as in the loop,
        and nothing of the turn is committed.
        """
        numbered = [self._numbered(m) for m in messages]
        serdes = ((self.config.key_decoder, self.config.value_decoder) if encoded
                  else (_AS_GIVEN, _AS_GIVEN))
        batch = decode_batch(numbered, *serdes,
                             set_aside=encoded and self.config.on_decode_error != "fail",
                             keep_read=self.config.on_process_error == "dead_letter")
        for partition in batch.by_partition.keys() | {r.partition for r in batch.undecodable}:
            self.processor(partition)
        return self._run(batch)

    @property
    def wall_time(self) -> float:
        """The driver's wall clock, in seconds since the epoch."""
        return self._wall_time

    def _wall_clock(self) -> float:
        return self._wall_time

    def stream_time(self, partition: int = 0) -> int | None:
        """``partition``'s stream time in milliseconds (``None`` until one is known)."""
        return self._engine.time.clock(partition).stream_time

    def advance_wall_clock(self, seconds: float) -> list[OutgoingMessage]:
        """Move the wall clock on by ``seconds`` and, when a wall-clock timer or task is
        due, run a turn with no input, as the idle loop does; return what it sent.

        Like the loop after a pause, a timer or task fires once however many of its
        intervals the jump covers (missed runs are skipped): advance step by step to
        see every run."""
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
            raise ValueError(f"advance_wall_clock() takes seconds >= 0, got {seconds!r}")
        self._wall_time += seconds
        if not self._engine.time.due():
            return []
        return self._run(Batch())

    def advance_stream_time(self, to: int, partition: int = 0) -> list[OutgoingMessage]:
        """Move ``partition``'s stream time on to ``to`` (milliseconds since the epoch), as
        a record with that event time would, in a turn with no input: its stream-time
        timers due by then fire (and wall-clock ones due now). Return what it sent.
        Stream time never goes back: a ``to`` before it is a ``ValueError``."""
        if isinstance(to, bool) or not isinstance(to, int) or to < 0:
            raise ValueError(f"advance_stream_time() takes milliseconds >= 0, got {to!r}")
        current = self.stream_time(partition)
        if current is not None and to < current:
            raise ValueError(f"stream time of partition {partition} is {current}; it never "
                             f"goes back to {to}")
        self.processor(partition)
        return self._run(Batch(), stream_times={partition: to})

    def _run(self, batch: Batch, stream_times: dict[int, int] | None = None
             ) -> list[OutgoingMessage]:
        """One turn, then (an app) a turn per round of what it sent to repartitions;
        returns everything sent."""
        start = scan = len(self.sent)
        result = self._engine.run(batch, stream_times=stream_times)
        self.committed.update(result.next_offsets)
        for _ in range(_MAX_HOPS):
            hops = [self._numbered(self._read_back(m)) for m in self.sent[scan:]
                    if m.topic in self._internal]
            if not hops:
                return self.sent[start:]
            scan = len(self.sent)
            for message in hops:
                self.processor(message.partition)
            result = self._engine.run(decode_batch(hops, self.config.key_decoder,
                                                   self.config.value_decoder))
            self.committed.update(result.next_offsets)
        raise RuntimeError(f"the app sent to its repartitions in {_MAX_HOPS} turns in a row: "
                           "a cycle through a repartition?")

    def _read_back(self, sent: OutgoingMessage) -> Message:
        """A message sent to a repartition, as the turn reading it gets it (bytes)."""
        partition = sent.partition if sent.partition is not None else (
            murmur2_partition(sent.key, self._partitions) if sent.key is not None else 0)
        return Message(sent.topic, partition, -1, sent.key, sent.value, sent.timestamp,
                       sent.headers or (), TIMESTAMP_CREATE_TIME if sent.timestamp
                       else TIMESTAMP_NONE)

    def processor(self, partition: int = 0) -> MessageProcessor:
        """The processor instance of ``partition``, built on first use."""
        state = self._engine.partitions.get(partition)
        if state is None:
            state = self._engine.open_partition(partition, self._factory, self._store_specs,
                                                StoreRuntime(self.config, partition,
                                                             self._port,
                                                             changelogs=self.changelogs,
                                                             wall_clock=self._wall_clock))
        assert state.processor is not None
        return state.processor

    def store(self, name: str, partition: int = 0) -> KeyValueStore:
        """The store ``name`` of ``partition``."""
        self.processor(partition)
        return self._engine.partitions[partition].stores[name]

    def close(self) -> None:
        """Close the processors and stores (a RocksDB table's files are then free for
        another driver on the same ``state_dir``); the driver is not used after."""
        close_all([*self._engine.close_steps(), *[spec.close for spec in self._store_specs]],
                  self.config.name)

    def outputs(self, topic: str | None = None) -> list[tuple[Any, Any]]:
        """(key, value) pairs sent to ``topic`` (or every topic), decoded with the serdes
        (a declared topic's own value serde, ``OutputTopic.value_serde``, for its values)."""
        key_serde, value_serde = self.config.key_decoder, self.config.value_decoder
        own = value_serdes(self.config.output_topics)
        return [(None if m.key is None else key_serde.decode(m.key),
                 own.get(m.topic, value_serde).decode(m.value))
                for m in self.sent if topic is None or m.topic == topic]

    def _numbered(self, message: Message) -> Message:
        tp = (message.topic, message.partition)
        if message.offset < 0:
            message = message._replace(offset=self._next_offset.get(tp, 0))
        self._next_offset[tp] = message.offset + 1
        return message


class _AckedList:
    """The driver's output port: produced messages count as acked when waited for;
    in a transaction, once it commits (an aborted one's are dropped). Records of the
    tables' changelog topics go to ``changelogs`` instead (a committed transaction's
    partitions each get a marker, as Kafka writes one); a record without a timestamp
    takes the driver's wall clock, as a Kafka producer stamps its own."""

    def __init__(self, changelogs: MemoryChangelogs, changelog_topics: Collection[str],
                 wall_clock: Callable[[], float]) -> None:
        self.acked: list[OutgoingMessage] = []
        self._wall_clock = wall_clock
        self._queued: list[OutgoingMessage] = []
        self._transaction: list[OutgoingMessage] | None = None
        self._changelogs, self._changelog_topics = changelogs, frozenset(changelog_topics)

    def produce(self, messages: Sequence[OutgoingRecord]) -> None:
        self._queued.extend(map(OutgoingMessage.of, messages))

    def wait_for_acks(self, waiting: Callable[[], None] | None = None) -> None:
        if self._transaction is None:
            self._deliver(self._queued)
        else:
            self._transaction.extend(self._queued)
        self._queued.clear()

    def missing_topics(self, topics: Collection[str]) -> dict[str, str]:
        """The driver has no cluster: every topic exists (``InMemoryBroker`` has topics)."""
        return {}

    def begin(self) -> None:
        self._transaction = []

    def add_offsets(self, next_offsets: dict[TopicPartitionKey, int], note: str | None = None,
                    group: object = None) -> None:
        """The driver commits no offsets: nothing to add."""

    def commit(self, next_offsets: dict[TopicPartitionKey, int], note: str | None = None,
               group: object = None) -> None:
        self.wait_for_acks()
        written = self._deliver(self._transaction or ())
        for topic, partition in written:
            self._changelogs.mark(topic, partition)
        self._transaction = None

    def abort(self) -> bool:
        self._queued.clear()
        was_open, self._transaction = self._transaction is not None, None
        return was_open

    def _deliver(self, messages: Iterable[OutgoingMessage]) -> set[TopicPartitionKey]:
        """Acked: ``messages`` to ``acked``, changelog records to the changelogs; returns
        the changelog partitions written."""
        written: set[TopicPartitionKey] = set()
        for message in messages:
            if message.topic in self._changelog_topics:
                partition = message.partition or 0
                self._changelogs.append(message.topic, partition, message.key, message.value,
                                        message.timestamp or int(self._wall_clock() * 1000),
                                        headers=message.headers)
                written.add((message.topic, partition))
            else:
                self.acked.append(message)
        return written
