"""``InputConsumer`` wraps confluent_kafka.Consumer: checks the input topics,
assigns a static partition set (or subscribes as a member of the group, in group
mode), polls, and commits synchronously. Kafka's
exceptions become kasper_py's here and nowhere else.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

import structlog
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]  # stubs omit it

from kasper_py.config import Config
from kasper_py.exceptions import CommitError, ConsumeError, TopicError
from kasper_py.kafka.admin import shared_client, with_inputs_listed
from kasper_py.kafka.client_log import with_client_log
from kasper_py.kafka.offsets import lowered
from kasper_py.kafka.ports import Rebalance
from kasper_py.kafka.topics import task_count, topic_counts, topic_keys
from kasper_py.message import TopicPartitionKey

__all__ = ["InputConsumer"]

_METADATA_TIMEOUT = 30.0
# The group coordinator moves or is still loading (a new broker, a new __consumer_offsets
# partition): librdkafka reports these to committed() instead of retrying them.
_COORDINATOR_BUSY = frozenset({KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                               KafkaError.COORDINATOR_NOT_AVAILABLE})
# Consumer errors that librdkafka retries by itself; the loop logs them and goes on.
_TRANSIENT = _COORDINATOR_BUSY | {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN,
                                  KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT,
                                  KafkaError.NETWORK_EXCEPTION}

# A commit that waited in vain: for a coordinator (librdkafka gives up after
# session.timeout.ms), or for the coordinator's answer (socket.timeout.ms).
_WAITED = frozenset({KafkaError._WAIT_COORD, KafkaError._TIMED_OUT,
                     KafkaError.REQUEST_TIMED_OUT})
_COMMIT_BOUND = (" (librdkafka waits up to session.timeout.ms for a coordinator, then "
                 "socket.timeout.ms for its answer)")

_log = structlog.get_logger("kasper_py")


class InputConsumer:
    """The consumer of one TopicProcessor; never commits on its own."""

    def __init__(self, config: Config) -> None:
        self._config = config
        # Co-partitioned inputs aligned (kafka/alignment.py): where a partition's fetch
        # reached its end, past transaction markers, tells a caught-up input from one
        # behind. This consumer only: a changelog restore reads to its own end its way.
        aligned = len(config.input_topics) > 1 and config.max_task_idle is not None
        conf = {**config.to_consumer_conf(), "enable.partition.eof": aligned}
        self._consumer = Consumer(with_client_log(conf, config.name, "consumer"))
        self._ends: dict[TopicPartitionKey, int] | None = {} if aligned else None
        """With co-partitioned inputs aligned: the offset each partition's fetch last
        reached its end at, past any transaction marker."""
        self._counts: dict[str, int] = {}
        """Each input topic's partition count, once ``partition_count`` read them."""
        self.assigned: list[TopicPartitionKey] = []
        self.from_start: frozenset[str] = frozenset()
        self._paused: set[TopicPartitionKey] = set()
        self._held_back: set[TopicPartitionKey] = set()
        """Keys ``hold_back`` paused, until ``read_on`` (or they are no longer assigned)."""
        self._assigning: frozenset[TopicPartitionKey] = frozenset()
        """The keys ``on_assign`` is being told of: not assigned to the client yet."""

    def use(self, config: Config, from_start: Collection[str] = ()) -> None:
        """Read ``config``'s input topics (an app's plan adds its repartitions), those of
        ``from_start`` from their beginning when nothing is committed."""
        self._config, self.from_start = config, frozenset(from_start)

    def partition_count(self) -> int:
        """Check every input topic exists and all have one partition count; return it.
        A topic missing from the metadata is looked for again for a few seconds before
        the ``TopicError`` naming it (``admin.with_inputs_listed``)."""
        self._counts = with_inputs_listed(
            self._metadata, lambda metadata: topic_counts(self._config, metadata))
        return task_count(self._config, self._counts)

    def _metadata(self) -> Any:
        try:
            return self._consumer.list_topics(timeout=_METADATA_TIMEOUT)
        except KafkaException as exc:
            self._consumer.poll(0)  # delivers the client's log lines: refused, DNS, TLS...
            raise TopicError(f"cannot read metadata from {self._config.bootstrap_servers} "
                             f"within {_METADATA_TIMEOUT:g}s: {exc.args[0]}") from exc

    def keys(self, partitions: Sequence[int]) -> list[TopicPartitionKey]:
        """Partition numbers ``partitions`` of the input topics that have them."""
        return topic_keys(self._config.input_topics, self._counts, partitions)

    def assign(self, partitions: Sequence[int], below: Mapping[TopicPartitionKey, int] | None = None
               ) -> dict[TopicPartitionKey, int | None]:
        """Assign ``partitions`` of every input topic at their committed offsets, lowered
        to ``below`` where that is lower (where none is committed: ``auto_offset_reset``);
        returns those start offsets.

        The offsets are read here, with retries while the group coordinator moves or
        loads, and handed to ``assign``: left to librdkafka, such a failure on a fresh
        broker leaves the partitions without a start position and the loop idle.
        """
        keys = self.keys(partitions)
        committed = lowered(self.committed(keys), below or {})
        self._consumer.assign([TopicPartition(*tp, self._start(tp, o))
                               for tp, o in committed.items()])
        self.assigned = keys
        self._forget_ends(keys)
        return committed

    def assign_more(self, partitions: Sequence[int],
                    below: Mapping[TopicPartitionKey, int] | None = None
                    ) -> dict[TopicPartitionKey, int | None]:
        """Also assign ``partitions`` (a standby promoted in place), as ``assign`` does;
        the partitions assigned already keep their positions (``incremental_assign``)."""
        keys = [tp for tp in self.keys(partitions) if tp not in self.assigned]
        committed = lowered(self.committed(keys), below or {})
        try:
            self._consumer.incremental_assign([TopicPartition(*tp, self._start(tp, o))
                                               for tp, o in committed.items()])
        except KafkaException as exc:
            raise ConsumeError(f"assigning {keys}: {exc.args[0]}") from exc
        self.assigned = [*self.assigned, *keys]
        self._forget_ends(keys)
        return committed

    def unassign(self, partitions: Sequence[int]) -> None:
        """Stop reading ``partitions`` (released in place); the others keep their
        positions (``incremental_unassign``)."""
        keys = [tp for tp in self.assigned if tp[1] in set(partitions)]
        self.read_on(keys)  # librdkafka keeps a pause through an unassign and a later assign
        try:
            self._consumer.incremental_unassign([TopicPartition(*tp) for tp in keys])
        except KafkaException as exc:
            raise ConsumeError(f"unassigning {keys}: {exc.args[0]}") from exc
        self.assigned = [tp for tp in self.assigned if tp not in keys]
        self._forget_ends(keys)

    def _start(self, key: TopicPartitionKey, offset: int | None) -> int:
        """Where to read ``key`` from: ``offset``, or where nothing committed points."""
        if offset is not None:
            return offset
        earliest = self._config.auto_offset_reset == "earliest" or key[0] in self.from_start
        return OFFSET_BEGINNING if earliest else OFFSET_END

    def subscribe(self, on_assign: Rebalance, on_revoke: Rebalance) -> None:
        """Group mode: join the group (``Config.to_consumer_conf`` picks the protocol).
        ``assigned`` follows the rebalances; a lost partition is revoked too."""

        conf = self._config.to_consumer_conf()
        incremental = (conf.get("group.protocol") == "consumer"
                       or conf.get("partition.assignment.strategy") == "cooperative-sticky")

        def assign(consumer: Consumer, partitions: list[TopicPartition]) -> None:
            keys = [(tp.topic, tp.partition) for tp in partitions]
            self.assigned = sorted({*self.assigned, *keys})
            self._forget_ends(keys)
            self._assigning = frozenset(keys)
            try:
                starts = {**self._from_start(keys), **(on_assign(keys) or {})}
            finally:
                self._assigning = frozenset()
            # OFFSET_INVALID: the committed offset. Assigned here, not left to the client
            # after the callback, so that the keys on_assign paused are paused before any
            # fetch.
            chosen = [TopicPartition(t, p, starts.get((t, p), OFFSET_INVALID)) for t, p in keys]
            if incremental:
                consumer.incremental_assign(chosen)
            else:
                consumer.assign(chosen)
            self._pause([tp for tp in keys if tp in self._paused])

        def revoke(_consumer: Consumer, partitions: list[TopicPartition]) -> None:
            keys = [(tp.topic, tp.partition) for tp in partitions]
            on_revoke(keys)
            gone = set(keys)
            # librdkafka keeps an application's pause through an unassign and a later
            # assign: a paused key given back would never be read again
            paused = [TopicPartition(*tp) for tp in gone & (self._paused | self._held_back)]
            if paused:
                self._consumer.resume(paused)
            self._paused -= gone
            self._held_back -= gone
            self.assigned = [tp for tp in self.assigned if tp not in gone]
            self._forget_ends(keys)

        self._consumer.subscribe(list(self._config.input_topics), on_assign=assign,
                                 on_revoke=revoke, on_lost=revoke)

    def _from_start(self, keys: list[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
        """Of ``keys``, those of ``from_start`` topics with no committed offset: at their
        beginning, whatever ``auto_offset_reset`` says."""
        mine = [tp for tp in keys if tp[0] in self.from_start]
        if not mine:
            return {}
        return {tp: OFFSET_BEGINNING for tp, o in self.committed(mine).items() if o is None}

    def pause(self, keys: Collection[TopicPartitionKey]) -> None:
        """Group mode: fetch no record of ``keys`` until ``resume``; those being assigned
        (inside ``on_assign``) as soon as they are. librdkafka discards what it fetched
        of them before; their position stays where the loop's reading stopped."""
        self._paused.update(keys)
        self._pause([tp for tp in keys if tp not in self._assigning])

    def _pause(self, keys: Sequence[TopicPartitionKey]) -> None:
        self._switch(self._consumer.pause, "pausing", keys)

    def _resume_fetch(self, keys: Sequence[TopicPartitionKey]) -> None:
        self._switch(self._consumer.resume, "resuming", keys)

    @staticmethod
    def _switch(switch: Callable[[list[TopicPartition]], None], doing: str,
                keys: Sequence[TopicPartitionKey]) -> None:
        """Pause or resume the fetch of ``keys`` (``switch``), in kasper_py's errors."""
        if keys:
            try:
                switch([TopicPartition(*tp) for tp in keys])
            except KafkaException as exc:
                raise ConsumeError(f"{doing} {keys}: {exc.args[0]}") from exc

    def hold_back(self, keys: Collection[TopicPartitionKey]) -> None:
        """Fetch no more of ``keys`` for now: librdkafka discards what it fetched of them
        and not yet handed out; each stays positioned after its last record read."""
        keys = [tp for tp in keys if tp not in self._held_back]
        self._pause(keys)
        self._held_back.update(keys)

    def read_on(self, keys: Collection[TopicPartitionKey]) -> None:
        """Fetch the keys held back again, from where reading stopped; a key ``pause``
        paused stays paused (``resume`` reads it again)."""
        keys = [tp for tp in keys if tp in self._held_back]
        self._held_back.difference_update(keys)
        self._resume_fetch([tp for tp in keys if tp not in self._paused])

    def resume(self, starts: Mapping[TopicPartitionKey, int | None]) -> None:
        """Seek each paused key of ``starts`` to its start (``None``: where nothing
        committed points), then fetch it again."""
        if not starts:
            return
        for tp, offset in starts.items():
            self._seek(TopicPartition(*tp, self._start(tp, offset)))
        self._resume_fetch([tp for tp in starts if tp not in self._held_back])
        self._paused -= set(starts)

    def _forget_ends(self, keys: Iterable[TopicPartitionKey]) -> None:
        """A partition (re)assigned, revoked or sought reads from a new place: where its
        fetch last ended says nothing of it."""
        if self._ends:
            for key in keys:
                self._ends.pop(key, None)

    def _seek(self, position: TopicPartition) -> None:
        """Seek one assigned partition. Until the client has looked up where an assigned
        partition starts (its committed offset: a round trip, milliseconds) a seek is
        refused as "erroneous state": asked again meanwhile, up to the metadata timeout."""
        deadline = time.monotonic() + _METADATA_TIMEOUT
        while True:
            try:
                self._consumer.seek(position)
                self._forget_ends([(position.topic, position.partition)])
                return
            except KafkaException as exc:
                error = exc.args[0]
                if error.code() != KafkaError._STATE or time.monotonic() >= deadline:
                    raise ConsumeError(f"seeking {position.topic}[{position.partition}] to "
                                       f"{position.offset}: {error.str()}",
                                       code=error.code()) from exc
            time.sleep(0.01)

    def consume(self, max_count: int, timeout: float) -> list[Any]:
        """Up to ``max_count`` raw records within ``timeout`` seconds."""
        try:
            records = self._consumer.consume(num_messages=max_count, timeout=timeout)
        except KafkaException as exc:
            raise ConsumeError(f"consume failed: {exc.args[0]}") from exc
        return records if self._ends is None else self._noting_ends(records)

    def _noting_ends(self, records: list[Any]) -> list[Any]:
        """``records`` without the partition-end events, each noted in ``_ends``."""
        kept, ends = [], self._ends
        assert ends is not None
        for record in records:
            error = record.error()
            if error is not None and error.code() == KafkaError._PARTITION_EOF:
                ends[(record.topic(), record.partition())] = record.offset()
            else:
                kept.append(record)
        return kept

    def transient_error(self, record: Any) -> bool:
        """True (and logged) when ``record`` carries an error librdkafka recovers from by
        itself: a moved or loading group coordinator, a lost connection, a timeout. No
        message is skipped by ignoring it: the consumer's position does not move."""
        error = record.error()
        if error.fatal() or error.code() not in _TRANSIENT:
            return False
        _log.warning("kasper.consumer_error_retried", processor=self._config.name,
                     error=error.str(), code=error.name())
        return True

    def commit(self, next_offsets: dict[TopicPartitionKey, int], note: str | None = None) -> None:
        """Commit synchronously, with ``note`` as each offset's metadata; raise
        ``CommitError`` if any partition was refused."""
        offsets = [TopicPartition(t, p, o) if note is None else TopicPartition(t, p, o, note)
                   for (t, p), o in next_offsets.items()]
        try:
            results = self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            error = exc.args[0]
            raise CommitError(f"commit of group {self._config.group!r} on "
                              f"{self._config.bootstrap_servers} failed: {error.str()}"
                              f"{_COMMIT_BOUND if error.code() in _WAITED else ''}",
                              code=error.code()) from exc
        for tp in results or ():
            if tp.error is not None:
                raise CommitError(
                    f"commit of {tp.topic}[{tp.partition}] offset {tp.offset} failed: "
                    f"{tp.error.str()}", code=tp.error.code(),
                )

    def group_metadata(self) -> object:
        """The consumer group's metadata, for ``OutputProducer.commit`` (exactly-once)."""
        return self._consumer.consumer_group_metadata()

    def notes(self, keys: Iterable[TopicPartitionKey] | None = None
              ) -> dict[TopicPartitionKey, str | None]:
        """The metadata of the group's committed offsets: loops' commit notes."""
        return {key: metadata for key, (_, metadata) in self._read_committed(keys).items()}

    def committed(
        self, keys: Iterable[TopicPartitionKey] | None = None
    ) -> dict[TopicPartitionKey, int | None]:
        """The group's committed next offsets (``None`` where nothing is committed).

        An error for the whole request or for one partition is retried while the group
        coordinator moves or loads, then raised as ``ConsumeError``: taken for "nothing
        committed", it would start that partition at ``auto_offset_reset``.
        """
        return {key: offset for key, (offset, _) in self._read_committed(keys).items()}

    def _read_committed(self, keys: Iterable[TopicPartitionKey] | None
                        ) -> dict[TopicPartitionKey, tuple[int | None, str | None]]:
        tps = [TopicPartition(t, p) for t, p in (keys if keys is not None else self.assigned)]
        deadline = time.monotonic() + _METADATA_TIMEOUT
        error: Any
        while True:
            try:
                result = self._consumer.committed(tps, timeout=_METADATA_TIMEOUT)
                failed = [tp for tp in result if tp.error is not None]
                if not failed:
                    break
                error, where = failed[0].error, f" for {failed[0].topic}[{failed[0].partition}]"
            except KafkaException as exc:
                error, where = exc.args[0], ""
            if error.code() not in _COORDINATOR_BUSY or time.monotonic() >= deadline:
                raise ConsumeError(f"reading committed offsets of group {self._config.group!r}"
                                   f"{where} failed: {error.str()} (asked "
                                   f"{self._config.bootstrap_servers}, waiting up to "
                                   f"{_METADATA_TIMEOUT:g}s)", code=error.code())
            time.sleep(0.2)
        return {(tp.topic, tp.partition): (None if tp.offset < 0 else tp.offset, tp.metadata)
                for tp in result}

    def positions(self) -> dict[TopicPartitionKey, int | None]:
        """Next offset the application will read, per assigned partition, if known: past
        the last record read, or (with ``enable.partition.eof``) past the end a fetch
        reached, transaction markers included, when that is further."""
        result = self._consumer.position([TopicPartition(t, p) for t, p in self.assigned])
        ends = self._ends or {}
        positions: dict[TopicPartitionKey, int | None] = {}
        for tp in result:
            key = (tp.topic, tp.partition)
            read = None if tp.offset == OFFSET_INVALID or tp.offset < 0 else tp.offset
            end = ends.get(key)
            positions[key] = read if end is None or (read is not None and read > end) else end
        return positions

    def watermarks(self, key: TopicPartitionKey, cached: bool = False) -> tuple[int, int]:
        """(low, high) watermark of one partition; cached values come from fetch responses."""
        tp = TopicPartition(*key)
        try:
            low, high = self._consumer.get_watermark_offsets(
                tp, timeout=_METADATA_TIMEOUT, cached=cached)
        except KafkaException as exc:
            raise ConsumeError(f"watermarks of {key[0]}[{key[1]}] on "
                               f"{self._config.bootstrap_servers} (waited up to "
                               f"{_METADATA_TIMEOUT:g}s): {exc.args[0]}") from exc
        return int(low), int(high)

    def open_transactions(self, keys: Sequence[TopicPartitionKey]) -> list[TopicPartitionKey]:
        """Of ``keys``, those a transaction is still open on: their last stable offset
        (the end a ``read_committed`` reader sees) is below their high watermark. Such a
        partition may be at its visible end yet gain records: a member's turn in flight,
        or a killed member's transaction until the broker aborts it (its timeout). None
        when this consumer reads uncommitted records, which it sees at once."""
        conf = self._config.to_consumer_conf()
        if not keys or conf.get("isolation.level") != "read_committed":
            return []
        client, _ = shared_client(self._config)
        ends = {level: self._latest(client, keys, level) for level in
                (IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED)}
        return [tp for tp in keys if ends[IsolationLevel.READ_COMMITTED][tp]
                < ends[IsolationLevel.READ_UNCOMMITTED][tp]]

    def _latest(self, client: Any, keys: Sequence[TopicPartitionKey],
                level: IsolationLevel) -> dict[TopicPartitionKey, int]:
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        asked = {TopicPartition(*tp): latest for tp in keys}
        try:
            futures = client.list_offsets(asked, isolation_level=level,
                                          request_timeout=_METADATA_TIMEOUT)
            return {(tp.topic, tp.partition): int(future.result().offset)
                    for tp, future in futures.items()}
        except KafkaException as exc:
            raise ConsumeError(f"end offsets ({level.name.lower()}) on "
                               f"{self._config.bootstrap_servers}: {exc.args[0]}") from exc

    def close(self) -> None:
        """Leave without committing: only the loop commits."""
        self._consumer.close()

