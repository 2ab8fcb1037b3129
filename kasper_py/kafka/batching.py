"""Turning polled records into a ``Batch``: gathered until full (the records, or bytes,
``sizing`` allows) or ``batch_wait`` is over, decoded, and grouped by partition number
across input topics. No Kafka client is touched here; the consumer hands raw records in.
"""

from __future__ import annotations

import bisect
import itertools
import operator
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kasper_py.exceptions import ConsumeError, OffsetError, SerdeError
from kasper_py.kafka.alignment import UNALIGNED, Alignment, runs_until
from kasper_py.message import PACKED, PACKED_KEY, Message, TopicPartitionKey, Undecodable
from kasper_py.serdes import BYTES, Serde, bound_to

__all__ = ["Batch", "Collector", "OffsetRange", "build_batch", "decode_batch", "offset_range"]


@dataclass
class OffsetRange:
    """First and last offset of one topic-partition in a batch, and its newest timestamp."""

    first: int
    last: int
    count: int = 1
    first_timestamp: int | None = None
    last_timestamp: int | None = None


@dataclass
class Batch:
    """One turn's input: messages per partition number, and the offset range per topic-partition."""

    by_partition: dict[int, list[Message]] = field(default_factory=dict)
    ranges: dict[TopicPartitionKey, OffsetRange] = field(default_factory=dict)
    undecodable: list[Undecodable] = field(default_factory=list)
    """Records set aside by the decode policy: in ``ranges`` (so committed), not in
    ``by_partition``."""
    read: dict[TopicPartitionKey, list[Message]] = field(default_factory=dict)
    """With ``keep_read``: the messages as read (key and value bytes) per
    topic-partition, in offset order, for dead letters of decoded messages."""

    def __len__(self) -> int:
        return sum(map(_COUNT, self.ranges.values()))

    def describe(self, partition: int | None = None) -> str:
        """``topic[p] offsets a..b`` for every range (or one partition's), for error text."""
        parts = [
            f"{topic}[{p}] offsets {r.first}..{r.last}"
            for (topic, p), r in sorted(self.ranges.items())
            if partition is None or p == partition
        ]
        return ", ".join(parts) or "no messages"

    def as_read(self, message: Message) -> Message:
        """``message`` with the key and value bytes it was read with (itself when the
        batch kept none: nothing was decoded, or ``keep_read`` was off)."""
        read = self.read.get((message.topic, message.partition))
        if not read:
            return message
        index = bisect.bisect_left(read, message.offset, key=lambda m: m.offset)
        found = read[index] if index < len(read) else None
        return found if found is not None and found.offset == message.offset else message

    def without(self, partitions: set[int]) -> Batch:
        """This batch less the records of ``partitions`` (released before its turn: not
        processed, nor committed, so their new owner reads them)."""
        if not partitions or (not partitions.intersection(self.by_partition) and not any(
                p in partitions for _, p in self.ranges)):
            return self
        return Batch({p: m for p, m in self.by_partition.items() if p not in partitions},
                     {tp: r for tp, r in self.ranges.items() if tp[1] not in partitions},
                     [u for u in self.undecodable if u.partition not in partitions],
                     {tp: m for tp, m in self.read.items() if tp[1] not in partitions})

    def next_offsets(self) -> dict[TopicPartitionKey, int]:
        """The offsets to commit: last processed offset + 1 for every topic-partition."""
        return {tp: r.last + 1 for tp, r in self.ranges.items()}


_TICK = 0.001
"""The client's timeout granularity: a consume given less than a millisecond returns
at once, so a batch with less than this left to wait is released (measured: the last
millisecond of every linger and ``batch_wait`` cost hundreds of empty consumes)."""


class Collector:
    """Gathers the raw records of the next batch, over one call or several: a batch is
    released at ``size`` records (or, with ``weigh``, ``max_bytes`` bytes of keys and
    values) or ``batch_wait`` seconds after its first consume, whichever comes first.
    The loop gathers ahead while a turn's acks are outstanding (``until``), then
    finishes the batch when the turn is done.

    With a ``linger`` (``Config.max_latency``; the loop sets it, ``size`` and
    ``max_bytes`` from a ``sizing.BatchController`` before each batch) a batch waits
    ``batch_wait`` at most for its first record, then ``linger`` seconds at most for
    more, and on release takes whatever else the client has already fetched, without
    waiting.

    With an ``alignment`` (co-partitioned inputs aligned by timestamp) ``take`` keeps
    the records it holds back as the start of the next batch; they do not count toward
    its size, so a batch holding them still consumes."""

    def __init__(self, consume: Callable[[int, float], Sequence[Any]], batch_size: int,
                 batch_wait: float, clock: Callable[[], float] = time.monotonic,
                 linger: float | None = None, *,
                 weigh: Callable[[Sequence[Any]], int] | None = None,
                 alignment: Alignment = UNALIGNED) -> None:
        self._consume, self._wait, self._clock = consume, batch_wait, clock
        self._weigh, self._alignment = weigh or _weightless, alignment
        self.size = batch_size
        """Records that make a full batch."""
        self.max_bytes: int | None = None
        """Bytes (keys and values, by ``weigh``) that make a full batch; ``None``: any.
        Each consume asks for what the bytes left hold at the batch's bytes per record
        so far, and the one that reaches it is kept whole."""
        self.linger = linger
        """Seconds a batch waits for more once its first record is in; ``None``: it
        waits out ``batch_wait`` from its first consume."""
        self.records: list[Any] = []
        """The records gathered so far, in arrival order."""
        self.bytes = 0
        """Bytes of keys and values gathered so far, by ``weigh`` (0 without one)."""
        self.held = 0
        """Of ``records``, how many (the first) the last batch held back."""
        self._held_bytes = 0
        self._deadline: float | None = None

    @property
    def full(self) -> bool:
        """True when the records gathered since the last batch make a full batch."""
        return len(self.records) - self.held >= self.size or (
            self.max_bytes is not None and self.bytes - self._held_bytes >= self.max_bytes)

    def gather(self, until: Callable[[], bool] | None = None, step: float | None = None) -> bool:
        """Consume toward a full batch; stop early once ``until()`` is true, letting each
        consume wait at most ``step`` seconds (never less than the client's millisecond
        tick). True when the batch is ready: full, or its wait is over."""
        clock, records = self._clock, self.records
        if self._deadline is None:
            self._deadline = clock() + self._wait
        while not self.full:
            if until is not None and until():
                return False
            remaining = self._deadline - clock()
            if remaining < _TICK:  # a shorter consume would not wait: it would spin
                if self.linger is not None and records:  # what is fetched comes along
                    self._add(self._room(), 0)
                return True
            # a step under the tick would not wait either: each consume would spin
            wait = remaining if step is None else min(max(step, _TICK), remaining)
            if self.linger is not None and len(records) == self.held:
                self._first(wait)
            else:
                self._add(self._room(), wait)
        return True

    def _room(self) -> int:
        """Records the batch may still take: up to ``size``, and with ``max_bytes`` about
        what the bytes left hold at the bytes per record gathered so far."""
        count, nbytes = len(self.records) - self.held, self.bytes - self._held_bytes
        room = self.size - count
        if self.max_bytes is not None and nbytes > 0 and count:
            left = (self.max_bytes - nbytes) * count // nbytes
            room = min(room, max(1, left))
        return room

    def _first(self, wait: float) -> None:
        """Wait up to ``wait`` for a first record (a consume of one returns as soon as
        one is there); once in, the batch is released ``linger`` seconds later."""
        assert self.linger is not None and self._deadline is not None
        self._add(1, wait)
        if len(self.records) > self.held:
            self._deadline = min(self._deadline, self._clock() + self.linger)

    def _add(self, count: int, wait: float) -> None:
        """Consume up to ``count`` records, waiting up to ``wait`` seconds; keep them."""
        records = self._consume(count, wait)
        self.records.extend(records)
        self.bytes += self._weigh(records)

    def drop(self, keys: set[TopicPartitionKey]) -> None:
        """Forget gathered records of ``keys`` (partitions revoked mid-gather). In place:
        a ``gather`` under way keeps appending to this same list."""
        held = self.held
        kept = [r for r in self.records[:held] if (r.topic(), r.partition()) not in keys]
        rest = [r for r in self.records[held:] if (r.topic(), r.partition()) not in keys]
        if held:
            self._held_bytes = self._held_bytes * len(kept) // held
        self.held = len(kept)
        self.records[:] = kept + rest
        self._alignment.forget(keys)

    def take(self) -> list[Any]:
        """The gathered records the batch takes; the next batch starts with those held
        back (none unless aligned), its wait not begun."""
        records, nbytes = self.records, self.bytes
        released, held = self._alignment.cut(records)
        if len(released) > self.size:  # held ones carried in: a batch never passes size
            released, over = _earliest(released, self.size)
            held = over + held  # each partition's records stay in order
        held_bytes = nbytes * len(held) // len(records) if held else 0
        self.records, self._deadline = held, None
        self.held, self.bytes, self._held_bytes = len(held), held_bytes, held_bytes
        return released


def _earliest(records: list[Any], size: int) -> tuple[list[Any], list[Any]]:
    """(taken, rest): at most ``size`` of ``records``, the earliest by timestamp, each
    topic-partition's taken ones a run from its first (so its batch is a run of offsets
    and co-partitioned inputs meet in time order); in gathered order. Timestamps that
    go back within a partition can leave nothing earliest first: then the first
    ``size`` gathered go."""
    stamps = [((r.topic(), r.partition()), r.timestamp()[1]) for r in records]
    cutoff = sorted(stamp for _, stamp in stamps)[size - 1]
    taken, rest = runs_until(records, stamps, lambda _key: cutoff, size)
    return (taken, rest) if taken else (records[:size], records[size:])


_COUNT = operator.attrgetter("count")


def _weightless(_records: Sequence[Any]) -> int:
    return 0


def build_batch(records: Sequence[Any], key_serde: Serde, value_serde: Serde,
                transient: Callable[[Any], bool] | None = None, *,
                set_aside: bool = False, keep_read: bool = False,
                only_topic: str | None = None) -> Batch:
    """confluent-kafka records (``Message``-shaped) into a decoded ``Batch``.

    A record carrying an error for which ``transient(record)`` is true (the client
    retries it by itself) is left out; any other raises ``ConsumeError``. Records are
    grouped as they are read (they come in runs of one partition) and decoded as
    ``decode_batch`` decodes, in the same pass: one ``Message`` a record (with
    ``keep_read``, which keeps the messages as read too, ``decode_batch``'s two).
    ``only_topic``: every record is of this topic (the loop reads one input topic), so
    no record is asked for its topic.
    """
    if keep_read:
        read, _ = _read(records, transient, only_topic, None)
        return _decoded(read, key_serde, value_serde, set_aside, keep_read)
    decoding = _Decoding(key_serde, value_serde, set_aside) if _decodes(
        key_serde, value_serde) else None
    return _group(*_read(records, transient, only_topic, decoding))


class _Decoding:
    """How ``_read`` decodes the records it reads: the serdes' ``decode`` (bound to the
    run's topic for a registry serde, whose subject is the topic's), and what it does
    with a record that does not decode."""

    def __init__(self, key_serde: Serde, value_serde: Serde, set_aside: bool) -> None:
        self.key_serde, self.value_serde, self.set_aside = key_serde, value_serde, set_aside
        self.per_topic = hasattr(key_serde, "for_topic") or hasattr(value_serde, "for_topic")
        self.aside: list[Undecodable] = []

    def decoders(self, topic: str) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
        """The key and value decoders of ``topic``'s records."""
        if self.per_topic:
            return bound_to(self.key_serde, topic).decode, bound_to(self.value_serde, topic).decode
        return self.key_serde.decode, self.value_serde.decode

    def result(self, by_tp: dict[TopicPartitionKey, list[Message]]
               ) -> tuple[dict[TopicPartitionKey, list[Message]], list[Undecodable]]:
        """What was decoded per topic-partition (runs all set aside left out), and what
        was set aside."""
        if not self.aside:
            return by_tp, []
        return {tp: run for tp, run in by_tp.items() if run}, self.aside

    def failed(self, read: Message, exc: SerdeError) -> Message | None:
        """``read`` did not decode: a packed record (``PACKED_KEY``, whose key no serde
        but bytes decodes on purpose, no value, its frame in its first header) as its
        reader takes one, no key and no value; else raise (``fail``) or set it aside
        (``None``)."""
        if read[3] == PACKED_KEY and read[4] is None and read[6] and read[6][0][0] == PACKED:
            return read._replace(key=None, value=None)
        if not self.set_aside:
            raise _undecodable_error(read.topic, read.partition, read.offset, exc) from exc
        self.aside.append(Undecodable(*read, error=str(exc)))
        return None


def _read(records: Sequence[Any], transient: Callable[[Any], bool] | None,
          only_topic: str | None, decoding: _Decoding | None,
          ) -> tuple[dict[TopicPartitionKey, list[Message]], list[Undecodable]]:
    """The records as ``Message``s per topic-partition, decoded with ``decoding`` (as
    read without it), and those set aside (see ``build_batch``)."""
    new = tuple.__new__  # Message is a NamedTuple; this skips its Python-level __new__
    by_tp: dict[TopicPartitionKey, list[Message]] = {}
    run_topic, run_partition, run = "", -1, []
    topic = only_topic or ""
    decode_key: Callable[[Any], Any] = BYTES.decode
    decode_value: Callable[[Any], Any] = BYTES.decode
    for record in records:
        if record.error() is not None:
            if transient is not None and transient(record):
                continue
            raise _consume_error(record)
        if not only_topic:
            topic = record.topic()
        partition = record.partition()
        if partition != run_partition or topic != run_topic:
            run_topic, run_partition = topic, partition
            run = by_tp.setdefault((topic, partition), [])
            if decoding is not None:
                decode_key, decode_value = decoding.decoders(topic)
        ts_type, ts = record.timestamp()
        headers = record.headers()
        # the two branches differ in the key and value only: a helper would cost a call
        if decoding is None:
            run.append(new(Message, (topic, partition, record.offset(), record.key(),
                                     record.value(), ts if ts_type else None,
                                     tuple(headers) if headers else (), ts_type)))
            continue
        try:
            run.append(new(Message, (topic, partition, record.offset(), decode_key(record.key()),
                                     decode_value(record.value()), ts if ts_type else None,
                                     tuple(headers) if headers else (), ts_type)))
        except SerdeError as exc:
            packed = decoding.failed(_as_read(record, topic, partition), exc)
            if packed is not None:
                run.append(packed)
    return (by_tp, []) if decoding is None else decoding.result(by_tp)


def _as_read(record: Any, topic: str, partition: int) -> Message:
    """``record`` as a ``Message`` as read (key and value bytes), as ``_read`` makes one."""
    ts_type, ts = record.timestamp()
    headers = record.headers()
    return Message(topic, partition, record.offset(), record.key(), record.value(),
                   ts if ts_type else None, tuple(headers) if headers else (), ts_type)


def decode_batch(messages: Sequence[Message], key_serde: Serde, value_serde: Serde,
                 set_aside: bool = False, *, keep_read: bool = False) -> Batch:
    """Messages as read (key and value bytes) into a decoded ``Batch``: the one decoder
    of every runner (the loop's records, the Spark task's Arrow rows, the test driver).

    Messages of one partition number are grouped topic by topic (in the order the
    topics first arrived), each topic's in offset order. Raises ``SerdeError`` for a
    message that does not decode and ``OffsetError`` when a topic-partition's offsets
    are not increasing. With ``set_aside``, a message that does not decode goes to
    ``Batch.undecodable`` instead (its offset is still committed with the batch).
    With ``keep_read`` the batch also keeps the messages as read (``Batch.as_read``),
    for dead letters of messages ``process()`` fails on.
    """
    by_tp: dict[TopicPartitionKey, list[Message]] = {}
    for key, run in itertools.groupby(messages, _TOPIC_PARTITION):
        by_tp.setdefault(key, []).extend(run)
    return _decoded(by_tp, key_serde, value_serde, set_aside, keep_read)


_TOPIC_PARTITION = operator.itemgetter(0, 1)


def _decoded(by_tp: dict[TopicPartitionKey, list[Message]], key_serde: Serde,
             value_serde: Serde, set_aside: bool, keep_read: bool) -> Batch:
    """Grouped messages as read into a ``Batch``, decoded (see ``decode_batch``)."""
    if not _decodes(key_serde, value_serde):
        return _group(by_tp, [])
    new, decoding = tuple.__new__, _Decoding(key_serde, value_serde, set_aside)
    decoded: dict[TopicPartitionKey, list[Message]] = {}
    for (topic, partition), run in by_tp.items():
        decode_key, decode_value = decoding.decoders(topic)
        messages = []
        for read in run:
            try:
                messages.append(new(Message, (topic, partition, read[2], decode_key(read[3]),
                                              decode_value(read[4]), read[5], read[6],
                                              read[7])))
            except SerdeError as exc:
                packed = decoding.failed(read, exc)
                if packed is not None:
                    messages.append(packed)
        if messages:
            decoded[(topic, partition)] = messages
    batch = _group(decoded, decoding.aside)
    if keep_read:
        batch.read = by_tp
    return batch


def _decodes(key_serde: Serde, value_serde: Serde) -> bool:
    """Whether messages decoded differ from messages as read: not when both are bytes."""
    return key_serde.name != "bytes" or value_serde.name != "bytes"


def _group(by_tp: dict[TopicPartitionKey, list[Message]], aside: list[Undecodable]) -> Batch:
    batch = Batch(undecodable=aside)
    for (topic, partition), messages in by_tp.items():
        first, last = messages[0], messages[-1]
        batch.ranges[(topic, partition)] = offset_range(
            (topic, partition), first.offset, last.offset, len(messages),
            first_timestamp=first.timestamp, last_timestamp=last.timestamp)
        batch.by_partition.setdefault(partition, []).extend(messages)
    for record in aside:  # committed with the batch, though no processor sees them
        offsets = batch.ranges.get((record.topic, record.partition))
        if offsets is None:
            batch.ranges[(record.topic, record.partition)] = OffsetRange(
                record.offset, record.offset, 1, record.timestamp, record.timestamp)
        else:
            offsets.first = min(offsets.first, record.offset)
            offsets.last = max(offsets.last, record.offset)
            offsets.count += 1
    return batch


def offset_range(key: TopicPartitionKey, first: int, last: int, count: int, *,
                 first_timestamp: int | None, last_timestamp: int | None) -> OffsetRange:
    """The range of ``count`` messages of one topic-partition from ``first`` to ``last``;
    raises ``OffsetError`` when they cannot be in increasing offset order."""
    # Offsets are unique and increasing, so n messages span at least n offsets.
    if last - first + 1 < count:
        raise OffsetError(f"{key[0]}[{key[1]}] offsets are not increasing within a batch "
                          f"({count} messages in {first}..{last})")
    return OffsetRange(first, last, count, first_timestamp, last_timestamp)


def _consume_error(record: Any) -> ConsumeError:
    error = record.error()
    return ConsumeError(f"consuming {record.topic()}[{record.partition()}] failed: {error.str()}",
                        code=error.code())


def _undecodable_error(topic: str, partition: int, offset: int, exc: SerdeError) -> SerdeError:
    """The error the ``fail`` policy raises: the serde's, with the record's coordinates."""
    return SerdeError(f"cannot decode {topic}[{partition}] offset {offset}: {exc} "
                      "(on_decode_error='fail'; 'skip' or 'dead_letter' would set it aside)")
