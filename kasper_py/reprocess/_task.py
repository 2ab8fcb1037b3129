"""What runs inside a Spark task: Arrow record batches of Kafka records, sorted by
partition number (and, per topic, by offset), become ``Message`` batches of
``batch_size`` fed to the user's processor of that partition through a ``Sender``.

Per batch, the loop's order: process, flush the stores, produce. With stores, every
batch's output is acked before the next (local tables apply their writes only then);
without, acks are awaited at the end of each partition. Any error fails the task, and
so the job, before a handoff could happen. Nothing here imports pyspark.
"""

from __future__ import annotations

import base64
import importlib
import json
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, cast

from kasper_py._closing import close_all
from kasper_py.batching import Batch, OffsetRange
from kasper_py.config import Config
from kasper_py.dead_letters import Undecodable, send_aside, undecodable_error
from kasper_py.exceptions import KasperError, OffsetError, ProcessingError, SerdeError, StoreError
from kasper_py.message import Message, OutgoingMessage
from kasper_py.processor import MessageProcessor, ProcessorContext, ProcessorFactory
from kasper_py.producer import OutputProducer
from kasper_py.sender import Sender
from kasper_py.stores.base import (
    KeyValueStore,
    StoreRuntime,
    StoreSpec,
    check_effectively_once_alone,
)

__all__ = ["COLUMNS", "STATS_SCHEMA", "PartitionStats", "TaskSpec", "run_task"]

TopicPartitionKey = tuple[str, int]
Output = Literal["kafka", "stores"]
Record = Message | Undecodable
"""An input record as a task holds it: decoded, or set aside by the decode policy."""

COLUMNS = ("topic", "partition", "offset", "key", "value", "timestamp", "timestampType",
           "headers")
"""The columns a task reads, in order; ``timestamp`` in epoch ms, ``headers`` as JSON."""

STATS_SCHEMA = ("partition long, messages long, produced long, discarded long, "
                "undecodable long, batches long, seconds double, ranges string")
"""The Spark schema of what a task returns: one row per partition it processed."""


@dataclass(frozen=True)
class TaskSpec:
    """Everything a task needs, pickled by Spark and shipped to the executors."""

    config: Config
    factory: ProcessorFactory
    stores: tuple[StoreSpec, ...] = ()
    output: Output = "kafka"


@dataclass
class PartitionStats:
    """What a task did with one partition number."""

    partition: int
    messages: int = 0
    produced: int = 0
    discarded: int = 0
    """Messages sent by the processor but not produced (``output="stores"``)."""
    undecodable: int = 0
    """Input messages that did not decode, set aside by ``Config.on_decode_error``."""
    batches: int = 0
    seconds: float = 0.0
    ranges: dict[str, list[int]] = field(default_factory=dict)
    """First and last offset processed per input topic."""

    def row(self) -> dict[str, Any]:
        """The row returned to the driver (``ranges`` as JSON)."""
        values = asdict(self)
        values["ranges"] = json.dumps(self.ranges)
        return values

    @classmethod
    def from_row(cls, row: Any) -> PartitionStats:
        """Rebuild from a row of ``STATS_SCHEMA``."""
        values = dict(row.asDict() if hasattr(row, "asDict") else row)
        values["ranges"] = json.loads(values["ranges"])
        return cls(**values)


def run_task(
    spec: TaskSpec,
    batches: Iterable[Any],
    report: Callable[[list[PartitionStats]], None] | None = None,
    producer_factory: Callable[[Config], OutputProducer] = OutputProducer,
) -> Iterator[Any]:
    """Process the Arrow batches of one Spark partition; yield one Arrow batch of stats.

    ``report`` receives each finished partition's stats (a Spark accumulator's ``add``).
    """
    producer = producer_factory(spec.config)
    done: list[PartitionStats] = []
    runner: PartitionRunner | None = None
    failed = True
    try:
        for batch in batches:
            messages = _messages(batch, spec.config)
            for partition, start, stop in _runs(messages):
                if runner is None or runner.partition != partition:
                    if runner is not None:
                        done.append(_finish(runner, report))
                    _check_new(partition, done)
                    runner = PartitionRunner(spec, partition, producer)
                runner.feed(messages[start:stop])
        if runner is not None:
            done.append(_finish(runner, report))
            runner = None
        failed = False
    finally:
        steps = [] if runner is None else [runner.abort]
        # a failed task's queued output is dropped: the job fails and hands nothing off
        steps += [lambda: producer.close(discard=failed),
                  *(store_spec.close for store_spec in spec.stores)]
        close_all(steps, spec.config.name)
    if done:  # an empty task yields nothing: a batch without columns would not match
        yield _arrow().RecordBatch.from_pylist([stats.row() for stats in done])


def _finish(runner: PartitionRunner, report: Callable[[list[PartitionStats]], None] | None
            ) -> PartitionStats:
    stats = runner.finish()
    if report is not None:
        report([stats])
    return stats


def _check_new(partition: int, done: Sequence[PartitionStats]) -> None:
    if any(stats.partition == partition for stats in done):
        raise OffsetError(f"partition {partition} reached this task in two separate runs; "
                          "its records must arrive together, sorted by partition")


def _arrow() -> Any:
    # pyarrow ships no type stubs; importing it by name keeps mypy's strict mode as is.
    return importlib.import_module("pyarrow")


class PartitionRunner:
    """Feeds one partition number's messages to its processor, ``batch_size`` at a time."""

    def __init__(self, spec: TaskSpec, partition: int, producer: OutputProducer) -> None:
        config = spec.config
        self.partition = partition
        self.stats = PartitionStats(partition)
        self._config, self._spec, self._producer = config, spec, producer
        self._started = time.perf_counter()
        self._pending: list[Record] = []
        self._stores = _open_stores(spec, partition, producer)
        self._outputs_first = any(s.effectively_once for s in self._stores.values())
        self._skip_below = _applied_offsets(self._stores.values())
        try:
            self._processor = _build_processor(spec, partition, self._stores)
        except BaseException:
            close_all([store.close for store in self._stores.values()], config.name)
            raise
        self._closed = False
        self._multi_topic = len(config.input_topics) > 1
        self._first: dict[str, int] = {}
        self._last: dict[str, int] = {}

    def feed(self, messages: list[Record]) -> None:
        """Buffer ``messages``; process every full batch."""
        size = self._config.batch_size
        buffer = self._pending + messages if self._pending else messages
        full = len(buffer) - len(buffer) % size
        for begin in range(0, full, size):
            self._turn(buffer[begin:begin + size])
        self._pending = buffer[full:]

    def finish(self) -> PartitionStats:
        """Process what is left, wait for every ack, close the processor and stores."""
        if self._pending:
            self._turn(self._pending)
            self._pending = []
        self._producer.wait_for_acks()
        self.abort()
        self.stats.seconds = time.perf_counter() - self._started
        self.stats.ranges = {topic: [self._first[topic], last]
                             for topic, last in sorted(self._last.items())}
        return self.stats

    def abort(self) -> None:
        """Close the processor and the stores without processing more (once; a close
        that fails is logged and the rest still close)."""
        if self._closed:
            return
        self._closed = True
        steps = [self._processor.close, *(store.close for store in self._stores.values())]
        close_all(steps, self._config.name)

    def _turn(self, records: list[Record]) -> None:
        if self._multi_topic:
            records = _grouped_by_topic(records)
        batch = self._batch(records)
        if self._skip_below:
            records = [m for m in records
                       if m.offset >= self._skip_below.get((m.topic, m.partition), -1)]
        messages, aside = _split(records, self._config.on_decode_error != "fail")
        sender = Sender(self._config.key_decoder, self._config.value_decoder)
        if messages:
            self._process(messages, sender, batch)
        if aside:
            send_aside(aside, self._config, sender)
            self.stats.undecodable += len(aside)
        if self._stores:
            self._apply_with_stores(sender, batch)
        else:
            self._send(sender.drain())
        self.stats.messages += len(batch)
        self.stats.batches += 1

    def _process(self, messages: list[Message], sender: Sender, batch: Batch) -> None:
        try:
            self._processor.process(messages, sender)
        except KasperError as exc:
            exc.uncommitted = batch.describe()
            raise
        except Exception as exc:
            raise ProcessingError.raised(self.partition, exc, batch.describe()) from exc

    def _apply_with_stores(self, sender: Sender, batch: Batch) -> None:
        """The loop's steps 2-3: flush the stores, produce, wait for every ack."""
        if self._outputs_first:
            # Effectively-once stores skip what they applied, so output is acked first.
            self._send(sender.drain())
            self._producer.wait_for_acks()
        next_offsets = batch.next_offsets()
        for name, store in self._stores.items():
            self._store_call(name, store.flush, next_offsets)
        self._send(sender.drain())
        self._producer.wait_for_acks()
        for name, store in self._stores.items():
            self._store_call(name, store.after_delivery)
        for key, offset in next_offsets.items():
            if offset >= self._skip_below.get(key, offset + 1):
                del self._skip_below[key]

    def _send(self, messages: list[OutgoingMessage]) -> None:
        if self._spec.output == "kafka":
            self._producer.produce(messages)
            self.stats.produced += len(messages)
        else:
            self.stats.discarded += len(messages)

    def _batch(self, messages: list[Record]) -> Batch:
        """The batch's offset ranges; checks each topic's offsets keep increasing."""
        batch = Batch()
        firsts: dict[str, Record] = {}
        lasts: dict[str, Record] = {}
        counts: dict[str, int] = {}
        for topic, messages_of_topic in _topic_runs(messages, self._multi_topic):
            firsts.setdefault(topic, messages_of_topic[0])
            lasts[topic] = messages_of_topic[-1]
            counts[topic] = counts.get(topic, 0) + len(messages_of_topic)
        for topic, first in firsts.items():
            last, count = lasts[topic], counts[topic]
            previous = self._last.get(topic, -1)
            if first.offset <= previous or last.offset - first.offset + 1 < count:
                raise OffsetError(f"{topic}[{self.partition}] offsets are not increasing "
                                  f"({count} messages in {first.offset}..{last.offset} after "
                                  f"offset {previous})")
            self._first.setdefault(topic, first.offset)
            self._last[topic] = last.offset
            batch.ranges[topic, self.partition] = OffsetRange(
                first.offset, last.offset, count, first.timestamp, last.timestamp)
        return batch

    def _store_call(self, name: str, method: Callable[..., Any], *args: Any) -> None:
        try:
            method(*args)
        except KasperError:
            raise
        except Exception as exc:
            raise StoreError(f"store {name!r} of partition {self.partition}: "
                             f"{type(exc).__name__}: {exc}") from exc


def _build_processor(spec: TaskSpec, partition: int,
                   stores: dict[str, KeyValueStore]) -> MessageProcessor:
    """Build the partition's processor, as the loop does."""
    return spec.factory(ProcessorContext(partition, spec.config, dict(stores)))


def _open_stores(spec: TaskSpec, partition: int, producer: OutputProducer
                 ) -> dict[str, KeyValueStore]:
    stores: dict[str, KeyValueStore] = {}
    try:
        for store_spec in spec.stores:
            runtime = StoreRuntime(spec.config, partition, producer)
            try:
                stores[store_spec.name] = store_spec.open(runtime)
            except KasperError:
                raise
            except Exception as exc:
                raise StoreError(f"store {store_spec.name!r} of partition {partition}: "
                                 f"{type(exc).__name__}: {exc}") from exc
        check_effectively_once_alone(stores)
    except BaseException:
        close_all([store.close for store in stores.values()], spec.config.name)
        raise
    return stores


def _applied_offsets(stores: Iterable[KeyValueStore]) -> dict[TopicPartitionKey, int]:
    """Next offsets effectively-once stores already applied; input below is skipped."""
    skip: dict[TopicPartitionKey, int] = {}
    for store in stores:
        for key, offset in store.applied_offsets().items():
            skip[key] = max(offset, skip.get(key, 0))
    return skip


def _split(records: list[Record], set_aside: bool) -> tuple[list[Message], list[Undecodable]]:
    """Messages for ``process()``, and the records the decode policy set aside."""
    if not set_aside:  # nothing was set aside: every record is a Message
        return cast(list[Message], records), []
    messages = [r for r in records if type(r) is Message]
    aside = [r for r in records if type(r) is Undecodable]
    return messages, aside


def _topic_runs(messages: list[Record], multi_topic: bool
                ) -> Iterator[tuple[str, list[Record]]]:
    if not multi_topic:
        yield messages[0].topic, messages
        return
    start = 0
    for index in range(1, len(messages) + 1):
        if index == len(messages) or messages[index].topic != messages[start].topic:
            yield messages[start].topic, messages[start:index]
            start = index


def _grouped_by_topic(messages: list[Record]) -> list[Record]:
    """Topic by topic, in the order the topics first appear, as the loop's batches are."""
    by_topic: dict[str, list[Record]] = {}
    for message in messages:
        by_topic.setdefault(message.topic, []).append(message)
    if len(by_topic) == 1:
        return messages
    return [message for group in by_topic.values() for message in group]


def _runs(messages: Sequence[Record]) -> Iterator[tuple[int, int, int]]:
    """(partition, start, stop) of each run of one partition number."""
    if not messages:
        return
    first = messages[0].partition
    if messages[-1].partition == first and all(m.partition == first for m in messages):
        yield first, 0, len(messages)
        return
    start = 0
    for index in range(1, len(messages) + 1):
        if index == len(messages) or messages[index].partition != messages[start].partition:
            yield messages[start].partition, start, index
            start = index


def _messages(batch: Any, config: Config) -> list[Record]:
    """Arrow batch of ``COLUMNS`` -> Messages, decoded with the configured serdes."""
    topics, partitions, offsets, keys, values, stamps, kinds, headers = (
        batch.column(i).to_pylist() for i in range(len(COLUMNS)))
    new = tuple.__new__  # Message is a NamedTuple; this skips its Python-level __new__
    messages: list[Any] = [new(Message, (topic, partition, offset, key, value,
                                         None if kind < 0 else stamp,
                                         _headers(header) if header else ()))
                           for topic, partition, offset, key, value, stamp, kind, header
                           in zip(topics, partitions, offsets, keys, values, stamps, kinds,
                                  headers, strict=True)]
    key_serde, value_serde = config.key_decoder, config.value_decoder
    if key_serde.name != "bytes" or value_serde.name != "bytes":
        set_aside = config.on_decode_error != "fail"
        return [_decoded(m, key_serde, value_serde, set_aside) for m in messages]
    return messages


def _decoded(message: Message, key_serde: Any, value_serde: Any, set_aside: bool) -> Record:
    """The message decoded; one that does not decode raises, or with ``set_aside``
    becomes an ``Undecodable`` that keeps its bytes (the batch still counts its offset)."""
    try:
        return message._replace(key=key_serde.decode(message.key),
                                value=value_serde.decode(message.value))
    except SerdeError as exc:
        if not set_aside:
            raise undecodable_error(message.topic, message.partition, message.offset,
                                    exc) from exc
        return Undecodable(*message, error=str(exc))


def _headers(encoded: str) -> tuple[tuple[str, bytes | None], ...]:
    """Spark's ``to_json`` of the headers column: ``[{"key": .., "value": base64}]``."""
    return tuple((header["key"], None if header.get("value") is None
                  else base64.b64decode(header["value"])) for header in json.loads(encoded))
