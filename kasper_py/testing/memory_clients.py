"""The clients of one process on an ``InMemoryBroker``: ``MemoryProcess`` (a crash kills
its clients together), its consumer (``InputPort``) and its producer (``ProducerPort``,
transactions included), behaving like ``InputConsumer`` and ``OutputProducer``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, NoReturn

from confluent_kafka import KafkaError

from kasper_py.config import Config
from kasper_py.exceptions import (
    CommitError,
    ConfigError,
    FencedError,
    KasperError,
    ProduceError,
    SimulatedCrash,
    TopicError,
)
from kasper_py.kafka.offsets import lowered, start_offset
from kasper_py.kafka.ports import Rebalance
from kasper_py.kafka.topics import task_count, topic_keys
from kasper_py.message import (
    TIMESTAMP_NONE,
    Message,
    OutgoingMessage,
    OutgoingRecord,
    TopicPartitionKey,
)
from kasper_py.testing.faults import INJECTED
from kasper_py.testing.memory_cluster import Commit, MemoryCluster, Owner, Queued

__all__ = ["MemoryProcess"]


class MemoryProcess:
    """The clients of one simulated process: a crash kills them together."""

    def __init__(self, broker: MemoryCluster, config: Config) -> None:
        self.broker = broker
        self.crashed = False
        self.consumer = _Consumer(self, config)
        self.producer = _Producer(self, config)

    def on_step(self, step: str) -> None:
        """``KafkaClients.on_step``: crash here when ``Faults.crash_at`` says so."""
        if self.broker.faults._fires(f"crash:{step}"):
            self.crashed = True
            self.producer.lose_queue()  # unacked output dies with the process
            raise SimulatedCrash(f"simulated crash at {step} ({INJECTED})")

    def check_alive(self) -> None:
        if self.crashed:
            raise KasperError("these clients belong to a process that crashed; "
                              "build new ones with InMemoryBroker.clients(config)")


class _Record:
    """A stored message with confluent-kafka's ``Message`` methods, as consumers return."""

    __slots__ = ("_message",)

    def __init__(self, message: Message) -> None:
        self._message = message

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return self._message.topic

    def partition(self) -> int:
        return self._message.partition

    def offset(self) -> int:
        return self._message.offset

    def key(self) -> bytes | None:
        return self._message.key  # type: ignore[no-any-return]

    def value(self) -> bytes | None:
        return self._message.value  # type: ignore[no-any-return]

    def timestamp(self) -> tuple[int, int]:
        ts = self._message.timestamp
        return (TIMESTAMP_NONE, -1) if ts is None else (self._message.timestamp_type, ts)

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        return list(self._message.headers) or None


class _Consumer:
    """``InputPort`` on the broker, behaving like ``InputConsumer``: same checks and
    errors, assignment at the committed offsets (else ``auto_offset_reset``)."""

    def __init__(self, process: MemoryProcess, config: Config) -> None:
        self._process, self._broker, self._config = process, process.broker, config
        self._counts: dict[str, int] = {}
        self.assigned: list[TopicPartitionKey] = []
        self._positions: dict[TopicPartitionKey, int] = {}
        self._rotation = 0
        self.from_start: frozenset[str] = frozenset()
        self.paused: set[TopicPartitionKey] = set()
        """Keys not read until resumed (``pause``)."""
        self.held_back: set[TopicPartitionKey] = set()
        """Keys not read until read on (``hold_back``)."""

    def use(self, config: Config, from_start: Collection[str] = ()) -> None:
        """As ``InputConsumer.use``: read ``config``'s input topics, ``from_start``'s
        from their beginning when nothing is committed."""
        self._config, self.from_start = config, frozenset(from_start)

    def partition_count(self) -> int:
        """Every input topic exists, each group read together with one partition count:
        return the partition numbers the loop runs (``topics.task_count``)."""
        counts: dict[str, int] = {}
        for topic in self._config.input_topics:
            count = self._broker._partition_count(topic)
            if count is None:
                raise TopicError(f"input topic {topic!r}: does not exist")
            counts[topic] = count
        self._counts = counts
        return task_count(self._config, counts)

    def keys(self, partitions: Sequence[int]) -> list[TopicPartitionKey]:
        """Partition numbers ``partitions`` of the input topics that have them."""
        return topic_keys(self._config.input_topics, self._counts, partitions)

    def assign(self, partitions: Sequence[int], below: Mapping[TopicPartitionKey, int] | None = None
               ) -> dict[TopicPartitionKey, int | None]:
        """Start each partition of every input topic at its committed offset, lowered to
        ``below`` where that is lower (where none is committed: ``auto_offset_reset``);
        return those start offsets."""
        keys = self.keys(partitions)
        committed = lowered(self.committed(keys), below or {})
        self._start_at(committed)
        self.assigned = keys
        return committed

    def assign_more(self, partitions: Sequence[int],
                    below: Mapping[TopicPartitionKey, int] | None = None
                    ) -> dict[TopicPartitionKey, int | None]:
        """Also start ``partitions`` as ``assign`` does; the others keep their positions."""
        keys = [tp for tp in self.keys(partitions) if tp not in self.assigned]
        committed = lowered(self.committed(keys), below or {})
        self._start_at(committed)
        self.assigned = [*self.assigned, *keys]
        return committed

    def unassign(self, partitions: Sequence[int]) -> None:
        """Stop reading ``partitions``; the others keep their positions."""
        keys = [tp for tp in self.assigned if tp[1] in set(partitions)]
        self.assigned = [tp for tp in self.assigned if tp not in keys]
        for tp in keys:
            self._positions.pop(tp, None)

    def _start_at(self, starts: Mapping[TopicPartitionKey, int | None]) -> None:
        """Read each key of ``starts`` from its offset (``None``: where nothing committed
        points)."""
        for tp, offset in starts.items():
            reset = "earliest" if tp[0] in self.from_start else self._config.auto_offset_reset
            self._positions[tp] = start_offset(offset, *self._broker.watermarks(*tp), reset)

    def subscribe(self, on_assign: Rebalance, on_revoke: Rebalance) -> None:
        """Group mode needs a real broker's group coordinator."""
        raise ConfigError("assignment", "'group' needs a Kafka broker: MemoryCluster "
                          "assigns static partition sets only")

    def pause(self, keys: Collection[TopicPartitionKey]) -> None:
        """As ``InputConsumer.pause``: no record of ``keys`` is read until ``resume``."""
        self.paused.update(keys)

    def resume(self, starts: Mapping[TopicPartitionKey, int | None]) -> None:
        """As ``InputConsumer.resume``: the keys of ``starts`` are read again, from there."""
        self._start_at(starts)
        self.paused -= set(starts)

    def hold_back(self, keys: Collection[TopicPartitionKey]) -> None:
        """As ``InputConsumer.hold_back``: no record of ``keys`` is read until ``read_on``."""
        self.held_back.update(keys)

    def read_on(self, keys: Collection[TopicPartitionKey]) -> None:
        """As ``InputConsumer.read_on``: the keys held back are read again from there."""
        self.held_back.difference_update(keys)

    def consume(self, max_count: int, timeout: float) -> list[Any]:
        """Up to ``max_count`` records, a run per partition not paused, starting one
        partition further each call (fair, like fetches). Finding fewer, it does not
        sleep the ``timeout``: it moves the broker's clock on by it."""
        self._process.check_alive()
        records: list[Any] = []
        start = self._rotation % max(len(self.assigned), 1)
        self._rotation += 1
        for tp in self.assigned[start:] + self.assigned[:start]:
            if tp in self.paused or tp in self.held_back:
                continue
            got = self._broker._fetch(tp, self._positions[tp], max_count - len(records))
            self._positions[tp] += len(got)
            records += [_Record(m) for m in got]
        if len(records) < max_count:
            self._broker._wait(timeout, idle=not records)
        return records

    def transient_error(self, record: Any) -> bool:
        """Records from the broker carry no errors."""
        return False

    def commit(self, next_offsets: dict[TopicPartitionKey, int], note: str | None = None) -> None:
        """Commit for the config's group, ``note`` as metadata; ``CommitError`` when a
        ``fail_commit`` fault fires."""
        self._process.check_alive()
        fault = self._broker.faults._fired("commit")
        if fault is not None:
            raise CommitError(f"commit failed: {INJECTED}", retriable=fault.retriable)
        self._broker._commit(self._config.group, [
            Commit(t, p, offset, note) for (t, p), offset in next_offsets.items()])

    def group_metadata(self) -> object:
        """The config's group, as ``_Producer.commit`` takes it (opaque, like the real one)."""
        return _GroupMetadata(self._config.group)

    def notes(self, keys: Iterable[TopicPartitionKey] | None = None
              ) -> dict[TopicPartitionKey, str | None]:
        """The metadata of the group's latest commit per topic-partition (``None`` where
        nothing is committed)."""
        latest = {(c.topic, c.partition): c.metadata
                  for c in self._broker.commits(self._config.group)}
        return {tp: latest.get(tp) for tp in (self.assigned if keys is None else keys)}

    def committed(self, keys: Iterable[TopicPartitionKey] | None = None
                  ) -> dict[TopicPartitionKey, int | None]:
        """The group's committed next offsets (``None`` where nothing is committed)."""
        committed = self._broker.committed(self._config.group)
        return {tp: committed.get(tp) for tp in (self.assigned if keys is None else keys)}

    def positions(self) -> dict[TopicPartitionKey, int | None]:
        """The next offset to read of every assigned partition."""
        return {tp: self._positions[tp] for tp in self.assigned}

    def watermarks(self, key: TopicPartitionKey, cached: bool = False) -> tuple[int, int]:
        """(low, high) of one partition; always current."""
        return self._broker.watermarks(*key)

    def open_transactions(self, keys: Sequence[TopicPartitionKey]) -> list[TopicPartitionKey]:
        """None: the in-memory broker appends a transaction's records at its commit."""
        return []

    def close(self) -> None:
        """Nothing to release; positions and pauses are forgotten."""
        self._positions.clear()
        self.paused.clear()
        self.held_back.clear()
        self.assigned = []


class _GroupMetadata(NamedTuple):
    """``_Consumer.group_metadata()``: the group a transaction commits offsets for."""

    group: str


class _Producer:
    """``ProducerPort`` on the broker: messages are routed when handed over and
    appended (acked) in order by ``wait_for_acks``.

    Exactly-once, acked messages wait in the open transaction, and ``commit`` appends
    them together with the input offsets. ``init_transactions`` takes the config's
    transactional id over at a new epoch: an older producer with it is fenced, and its
    open transaction can never commit (it is aborted). A fenced producer learns it at
    its next call, where a real one learns it at its next request to the broker.
    """

    def __init__(self, process: MemoryProcess, config: Config) -> None:
        self._process, self._broker = process, process.broker
        self._queue: list[Queued] = []
        self._asked = False
        self._transactional_id = config.transactional_id if config.exactly_once else None
        self._owner: Owner | None = None
        self._transaction: list[Queued] | None = None
        """The acked records of the open transaction; ``None`` when none is open."""
        self._offsets: dict[TopicPartitionKey, tuple[int, str | None]] = {}
        """Input offsets added to the open transaction (``add_offsets``), with notes."""

    def produce(self, messages: Sequence[OutgoingRecord]) -> None:
        """Queue ``messages``; ``ProduceError`` for an unknown topic or partition, or
        when a ``fail_produce`` fault fires (the messages before it stay queued).
        Exactly-once, only inside a transaction, and ``FencedError`` once fenced."""
        self._process.check_alive()
        if self._transactional_id is not None and messages:
            self._check_not_fenced()
            if self._transaction is None:
                code = KafkaError._STATE
                raise ProduceError(f"cannot produce to {messages[0][0]!r}: "
                                   f"{KafkaError(code).str()}", code=code)
        self._asked = False
        faults = self._broker.faults
        for record in messages:
            message = OutgoingMessage.of(record)
            partition = self._broker._route(message)
            if faults._fires("produce"):
                raise ProduceError(f"cannot produce to {message.topic!r}: {INJECTED}")
            if message.timestamp is None:
                message = message._replace(timestamp=int(time.time() * 1000))
            self._queue.append(Queued(partition, message, faults._fires("delivery")))

    def missing_topics(self, topics: Collection[str]) -> dict[str, str]:
        """Those of ``topics`` the broker does not hold (it never creates one on demand)."""
        return {topic: "does not exist" for topic in topics
                if self._broker._partition_count(topic) is None}

    def outstanding(self) -> int:
        """Messages queued and not yet acked, as a real producer reports them while the
        loop reads ahead: the first ask after a hand-over sees them all, later asks none
        (acks arrive while the loop consumes once). ``wait_for_acks`` appends them."""
        asked, self._asked = self._asked, True
        return 0 if asked else len(self._queue)

    def wait_for_acks(self, waiting: Callable[[], None] | None = None) -> None:
        """Append every queued message in order (exactly-once: keep it in the open
        transaction); then raise the first delivery failure."""
        self._process.check_alive()
        if self._queue:
            self._check_not_fenced()
        failed = self._deliver()
        if failed is not None:
            raise ProduceError(f"delivery to {failed.message.topic}[{failed.partition}] "
                               f"failed: {INJECTED}")

    # -- transactions (exactly-once) ---------------------------------------------------

    def init_transactions(self) -> None:
        """Take over the config's transactional id, fencing any older producer with it."""
        self._process.check_alive()
        if self._transactional_id is None:
            self._refuse("taking over the transactional id", KafkaError._NOT_CONFIGURED)
        self._queue.clear()
        self._transaction = None
        self._owner = self._broker._take_over(self._transactional_id)

    def fence(self, transactional_id: str) -> None:
        """Take ``transactional_id`` over once, as another process's ``init_transactions``
        does: its producer is fenced and its open transaction can never commit."""
        self._process.check_alive()
        self._broker._take_over(transactional_id)

    def begin(self) -> None:
        """Open a transaction."""
        self._check_transaction("beginning a transaction", open_=False)
        self._transaction = []
        self._offsets = {}

    def add_offsets(self, next_offsets: dict[TopicPartitionKey, int], note: str | None,
                    group: object) -> None:
        """Keep ``next_offsets`` (``note`` as metadata) for the open transaction's commit;
        ``group`` as ``commit`` checks it."""
        self._check_transaction("adding the input offsets to the transaction", open_=True)
        _check_group(group)
        self._offsets.update({tp: (offset, note) for tp, offset in next_offsets.items()})

    def commit(self, next_offsets: dict[TopicPartitionKey, int], note: str | None,
               group: object) -> None:
        """Ack what is still queued (as ``commit_transaction`` flushes), then append the
        transaction's records and commit ``next_offsets`` (``note`` as metadata) for
        ``group``, all at once. When a ``fail_commit`` fault fires, ``CommitError`` and
        the transaction stays open, for ``abort``."""
        self._check_transaction("committing the transaction", open_=True)
        group = _check_group(group)
        fault = self._broker.faults._fired("commit")
        if fault is not None:
            raise CommitError(f"exactly-once: committing the transaction failed: {INJECTED}",
                              retriable=fault.retriable)
        self.wait_for_acks()
        assert self._owner is not None and self._transaction is not None  # checked above
        self._offsets.update({tp: (offset, note) for tp, offset in next_offsets.items()})
        commits = [Commit(t, p, offset, text)
                   for (t, p), (offset, text) in self._offsets.items()]
        if not self._broker._commit_transaction(self._owner, self._transaction, group.group,
                                                commits):
            raise self._fenced()
        self._transaction = None

    def abort(self) -> bool:
        """Drop the open transaction: its records and what is still queued are never
        appended; True when one was open. Never raises."""
        if self._transaction is None:
            return False
        self._transaction = None
        self._offsets = {}
        self._queue.clear()
        return True

    def _check_transaction(self, doing: str, *, open_: bool) -> None:
        """Raise as ``OutputProducer`` does when ``doing`` is not valid now: fenced, not
        exactly-once, not initialized, or the transaction not (or already) open."""
        self._process.check_alive()
        self._check_not_fenced()
        if self._transactional_id is None:
            self._refuse(doing, KafkaError._NOT_CONFIGURED)
        if self._owner is None or (self._transaction is not None) != open_:
            self._refuse(doing, KafkaError._STATE)

    def _check_not_fenced(self) -> None:
        if self._owner is not None and not self._broker._holds(self._owner):
            raise self._fenced()

    def _fenced(self) -> FencedError:
        code = KafkaError._FENCED
        return FencedError(f"exactly-once: transactional id {self._transactional_id!r} was "
                           f"taken over by a newer process ({KafkaError(code).str()})",
                           code=code)

    @staticmethod
    def _refuse(doing: str, code: int) -> NoReturn:
        raise CommitError(f"exactly-once: {doing} failed: {KafkaError(code).str()}", code=code)

    # -- closing -------------------------------------------------------------------------

    def close(self, discard: bool = False) -> None:
        """Abort an open transaction; deliver what is queued (failures are dropped, as a
        closing producer's callbacks are), or with ``discard`` drop it."""
        self.abort()
        if not discard and not self._process.crashed:
            self._deliver()
        self._queue.clear()

    def lose_queue(self) -> None:
        """The process died: what was not acked is gone, and so is its open transaction
        (Kafka aborts it when a successor takes the id over, or at its timeout)."""
        self._queue.clear()
        self._transaction = None

    def _deliver(self) -> Queued | None:
        """Ack every queued message: append it to its log, or keep it in the open
        transaction; return the first whose delivery fails."""
        queued, self._queue = self._queue, []
        delivered = [q for q in queued if not q.fails]
        if self._transaction is not None:
            self._transaction += delivered
        else:
            for q in delivered:
                self._broker._append(q.partition, q.message)
        failed = [q for q in queued if q.fails]
        return failed[0] if failed else None


def _check_group(group: object) -> _GroupMetadata:
    """``group``, which must be the consumer's ``group_metadata()``."""
    if not isinstance(group, _GroupMetadata):
        raise TypeError(f"group must be the consumer's group_metadata(), got {group!r}")
    return group
