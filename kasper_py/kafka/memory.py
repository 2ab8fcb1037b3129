"""``InMemoryBroker``: Kafka in a dict, for tests. It holds topics (partitions, offsets,
keys, values, headers, timestamps), consumer groups' committed offsets and store tables,
hands a real ``TopicProcessor`` clients bound to it, and injects ``Faults`` between the
steps of a turn. Public through ``kasper_py.testing``; no server, and nothing sleeps.

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

import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, NoReturn

from confluent_kafka import KafkaError

from kasper_py.config import Config
from kasper_py.exceptions import (
    CommitError,
    ConfigError,
    ConsumeError,
    FencedError,
    KasperError,
    ProduceError,
    SimulatedCrash,
    StoreError,
    TopicError,
)
from kasper_py.kafka.offsets import lowered, start_offset
from kasper_py.kafka.partitioner import murmur2, murmur2_partition
from kasper_py.kafka.ports import KafkaClients, Rebalance
from kasper_py.kafka.topics import common_partition_count
from kasper_py.message import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_NONE,
    Message,
    OutgoingMessage,
    OutgoingRecord,
    TopicPartitionKey,
)
from kasper_py.stores.base import StoreRuntime, StoreSpec, already_applied
from kasper_py.stores.memory import MemoryStore
from kasper_py.turn import STEPS

__all__ = ["CRASH_STEPS", "Commit", "Faults", "InMemoryBroker", "murmur2"]

CRASH_STEPS = STEPS
"""The step boundaries of a turn at which ``Faults.crash_at`` can stop a process."""
_IDLE_PAUSE = 0.001  # a consume that finds nothing yields, so an idle loop does not spin
_INJECTED = "injected by InMemoryBroker.faults"


class Commit(NamedTuple):
    """One committed offset, as ``InMemoryBroker.commits`` lists them."""

    topic: str
    partition: int
    offset: int
    """The next offset to read."""
    metadata: str | None
    """The loop's ``CommitNote`` (``kasper_py.kafka.offsets.CommitNote.decode`` reads it)."""


# -- faults ---------------------------------------------------------------------------


@dataclass
class _Trigger:
    """Lets ``nth - 1`` events pass, then fires on ``times`` events in a row."""

    nth: int
    times: int = 1
    seen: int = 0
    retriable: bool = False
    """The error it raises says the failure is transient (``KasperError.retriable``)."""

    def fire(self) -> bool:
        self.seen += 1
        return self.nth <= self.seen < self.nth + self.times

    @property
    def spent(self) -> bool:
        return self.seen >= self.nth + self.times - 1


class Faults:
    """Faults armed on an ``InMemoryBroker`` and fired by the clients and stores bound to
    it. Each fires once (or ``times`` times) and is then spent; events are counted from
    when the fault is armed, across every process on the broker. Arming a fault of a
    kind already armed replaces it."""

    def __init__(self) -> None:
        self._armed: dict[str, _Trigger] = {}

    def fail_produce(self, nth: int = 1) -> None:
        """The ``nth`` message a loop hands to its producer raises ``ProduceError`` at
        enqueue (as a full or refused queue would); the turn stops uncommitted."""
        self._armed["produce"] = _Trigger(_positive("nth", nth))

    def fail_delivery(self, nth: int = 1) -> None:
        """The ``nth`` message a loop hands to its producer gets a failed delivery
        report: it is not appended (the others are), and ``wait_for_acks`` raises
        ``ProduceError``."""
        self._armed["delivery"] = _Trigger(_positive("nth", nth))

    def fail_commit(self, times: int = 1, *, nth: int = 1, retriable: bool = False) -> None:
        """The ``nth`` offset commit (exactly-once: transaction commit) and the
        ``times - 1`` after it raise ``CommitError``; nothing is committed, and an open
        transaction is left for the loop to abort. A restarted loop's first commit is
        its start note's. ``retriable`` marks the error transient, as Kafka marks an
        abortable transaction error: an exactly-once loop runs the turn again."""
        self._armed["commit"] = _Trigger(_positive("nth", nth), _positive("times", times),
                                         retriable=retriable)

    def fail_store_write(self, store: str, times: int = 1) -> None:
        """The next ``times`` flushes (of any partition) of the broker store ``store``
        that have something to write raise ``StoreError``; nothing is written."""
        self._armed[f"store:{store}"] = _Trigger(1, _positive("times", times))

    def crash_at(self, step: str, turn: int = 1) -> None:
        """Kill the process the ``turn``-th time a loop reaches ``step`` (one of
        ``CRASH_STEPS``): ``SimulatedCrash`` stops ``run_loop`` with no cleanup."""
        if step not in CRASH_STEPS:
            raise ValueError(f"crash_at step must be one of {', '.join(CRASH_STEPS)}, "
                             f"got {step!r}")
        self._armed[f"crash:{step}"] = _Trigger(_positive("turn", turn))

    def armed(self) -> list[str]:
        """The faults not yet spent (``produce``, ``store:counts``, ``crash:after_flush``...):
        a test can assert the ones it armed did fire."""
        return sorted(self._armed)

    def clear(self) -> None:
        """Disarm every fault."""
        self._armed.clear()

    def _fires(self, kind: str) -> bool:
        """Count one event of ``kind``; True when an armed fault fires on it."""
        return self._fired(kind) is not None

    def _fired(self, kind: str) -> _Trigger | None:
        """Count one event of ``kind``; the armed fault that fires on it, if one does."""
        trigger = self._armed.get(kind)
        if trigger is None:
            return None
        fired = trigger.fire()
        if trigger.spent:
            del self._armed[kind]
        return trigger if fired else None


def _positive(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


# -- the broker -----------------------------------------------------------------------


class InMemoryBroker:
    """Topics, consumer groups and store tables in memory, shared by every
    ``TopicProcessor`` built with ``clients(config)``, so a test can crash one, start a
    fresh one on the same broker and assert on what a restarted process would see.

    Topics are not created on demand: producing to an unknown topic fails, as it does on
    clusters with ``auto.create.topics.enable=false`` (typos show up in tests).
    Partitioning: an explicit partition wins; keyed messages go to
    ``(murmur2(key) & 0x7fffffff) % partitions``, where the Java client and the loop's
    producer put them; messages without a key go round-robin per topic.
    """

    def __init__(self) -> None:
        self.faults = Faults()
        self._lock = threading.RLock()
        self._logs: dict[str, list[list[Message]]] = {}
        self._round_robin: dict[str, int] = {}
        self._commits: dict[str, list[Commit]] = {}
        self._tables: dict[tuple[str, int], dict[Any, Any]] = {}
        self._applied: dict[TopicPartitionKey, dict[TopicPartitionKey, int]] = {}
        self._epochs: dict[str, int] = {}
        self._now = 0.0
        self._started = time.time()

    # -- topics ----------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int = 1) -> None:
        """Create topic ``name`` with ``partitions`` empty partitions."""
        _positive("partitions", partitions)
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

    # -- processes and stores --------------------------------------------------------

    def clients(self, config: Config) -> KafkaClients:
        """A consumer and a producer for one process running ``config``, bound to this
        broker, with the faults' crash hook; pass them as ``TopicProcessor(clients=...)``."""
        process = _Process(self, config)
        return KafkaClients(process.consumer, process.producer, process.on_step, self.clock,
                            self.wall_clock)

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

    def _take_over(self, transactional_id: str) -> _Owner:
        """``init_transactions``: the id's next epoch, which fences every older one."""
        with self._lock:
            epoch = self._epochs.get(transactional_id, 0) + 1
            self._epochs[transactional_id] = epoch
            return _Owner(transactional_id, epoch)

    def _holds(self, owner: _Owner) -> bool:
        """True while no newer producer took over ``owner``'s transactional id."""
        with self._lock:
            return self._epochs.get(owner.transactional_id) == owner.epoch

    def _commit_transaction(self, owner: _Owner, records: list[_Queued], group: str,
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


def _utf8(data: bytes | str | None) -> bytes | None:
    return data.encode() if isinstance(data, str) else data


# -- the clients of one process ---------------------------------------------------------


class _Process:
    """The clients of one simulated process: a crash kills them together."""

    def __init__(self, broker: InMemoryBroker, config: Config) -> None:
        self.broker = broker
        self.crashed = False
        self.consumer = _Consumer(self, config)
        self.producer = _Producer(self, config)

    def on_step(self, step: str) -> None:
        """``KafkaClients.on_step``: crash here when ``Faults.crash_at`` says so."""
        if self.broker.faults._fires(f"crash:{step}"):
            self.crashed = True
            self.producer.lose_queue()  # unacked output dies with the process
            raise SimulatedCrash(f"simulated crash at {step} ({_INJECTED})")

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

    def __init__(self, process: _Process, config: Config) -> None:
        self._process, self._broker, self._config = process, process.broker, config
        self.assigned: list[TopicPartitionKey] = []
        self._positions: dict[TopicPartitionKey, int] = {}
        self._rotation = 0

    def partition_count(self) -> int:
        """Every input topic exists and all have one partition count: return it."""
        counts: dict[str, int] = {}
        for topic in self._config.input_topics:
            count = self._broker._partition_count(topic)
            if count is None:
                raise TopicError(f"input topic {topic!r}: does not exist")
            counts[topic] = count
        return common_partition_count(counts)

    def assign(self, partitions: Sequence[int], below: Mapping[TopicPartitionKey, int] | None = None
               ) -> dict[TopicPartitionKey, int | None]:
        """Start each partition of every input topic at its committed offset, lowered to
        ``below`` where that is lower (where none is committed: ``auto_offset_reset``);
        return those start offsets."""
        keys = [(t, p) for t in self._config.input_topics for p in partitions]
        committed = lowered(self.committed(keys), below or {})
        for tp, offset in committed.items():
            self._positions[tp] = start_offset(offset, *self._broker.watermarks(*tp),
                                               self._config.auto_offset_reset)
        self.assigned = keys
        return committed

    def subscribe(self, on_assign: Rebalance, on_revoke: Rebalance) -> None:
        """Group mode needs a real broker's group coordinator."""
        raise ConfigError("assignment", "'group' needs a Kafka broker: InMemoryBroker "
                          "assigns static partition sets only")

    def consume(self, max_count: int, timeout: float) -> list[Any]:
        """Up to ``max_count`` records, a run per partition, starting one partition
        further each call (fair, like fetches). Finding fewer, it does not sleep the
        ``timeout``: it moves the broker's clock on by it."""
        self._process.check_alive()
        records: list[Any] = []
        start = self._rotation % max(len(self.assigned), 1)
        self._rotation += 1
        for tp in self.assigned[start:] + self.assigned[:start]:
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
            raise CommitError(f"commit failed: {_INJECTED}", retriable=fault.retriable)
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

    def close(self) -> None:
        """Nothing to release; positions are forgotten."""
        self._positions.clear()
        self.assigned = []


@dataclass
class _Queued:
    partition: int
    message: OutgoingMessage
    """Its ``timestamp`` set: the producer stamps an unstamped message when it is sent."""
    fails: bool


class _Owner(NamedTuple):
    """A transactional id and the epoch a producer took it over at."""

    transactional_id: str
    epoch: int


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

    def __init__(self, process: _Process, config: Config) -> None:
        self._process, self._broker = process, process.broker
        self._queue: list[_Queued] = []
        self._asked = False
        self._transactional_id = config.transactional_id if config.exactly_once else None
        self._owner: _Owner | None = None
        self._transaction: list[_Queued] | None = None
        """The acked records of the open transaction; ``None`` when none is open."""

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
                raise ProduceError(f"cannot produce to {message.topic!r}: {_INJECTED}")
            if message.timestamp is None:
                message = message._replace(timestamp=int(time.time() * 1000))
            self._queue.append(_Queued(partition, message, faults._fires("delivery")))

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
                               f"failed: {_INJECTED}")

    # -- transactions (exactly-once) ---------------------------------------------------

    def init_transactions(self) -> None:
        """Take over the config's transactional id, fencing any older producer with it."""
        self._process.check_alive()
        if self._transactional_id is None:
            self._refuse("taking over the transactional id", KafkaError._NOT_CONFIGURED)
        self._queue.clear()
        self._transaction = None
        self._owner = self._broker._take_over(self._transactional_id)

    def begin(self) -> None:
        """Open a transaction."""
        self._check_transaction("beginning a transaction", open_=False)
        self._transaction = []

    def commit(self, next_offsets: dict[TopicPartitionKey, int], note: str | None,
               group: object) -> None:
        """Ack what is still queued (as ``commit_transaction`` flushes), then append the
        transaction's records and commit ``next_offsets`` (``note`` as metadata) for
        ``group``, all at once. When a ``fail_commit`` fault fires, ``CommitError`` and
        the transaction stays open, for ``abort``."""
        self._check_transaction("committing the transaction", open_=True)
        if not isinstance(group, _GroupMetadata):
            raise TypeError(f"group must be the consumer's group_metadata(), got {group!r}")
        fault = self._broker.faults._fired("commit")
        if fault is not None:
            raise CommitError(f"exactly-once: committing the transaction failed: {_INJECTED}",
                              retriable=fault.retriable)
        self.wait_for_acks()
        assert self._owner is not None and self._transaction is not None  # checked above
        commits = [Commit(t, p, offset, note) for (t, p), offset in next_offsets.items()]
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

    def _deliver(self) -> _Queued | None:
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
                             f"write failed: {_INJECTED}")
        with self._broker._lock:
            super().flush(next_offsets)
            if recording:
                self._applied.update(next_offsets)

    def applied_offsets(self) -> Mapping[TopicPartitionKey, int]:
        """Next input offsets this partition's data already holds (effectively-once)."""
        return dict(self._applied)
