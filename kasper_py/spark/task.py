"""What runs inside a Spark task: Arrow record batches of Kafka records, sorted by
partition number (and, per topic, by offset), become ``Batch``es of
``Config.largest_batch`` run through the turn engine (``kasper_py.turn``) with the task's
producer as its output port: the loop's turn, the loop's decoder, the loop's dead
letters. ``records.py`` turns each batch's records into the turn's input (an
``ArrowMessageProcessor``'s may stay columnar).

With stores, every batch's output is acked before the next (local tables apply their
writes only then); without, acks are awaited at the end of each partition. Any error
fails the task, and so the job, before a handoff could happen. Stream time and its
timers run as in the loop; there is no wall clock: wall-clock timers never fire and
scheduled tasks do not run. Nothing here imports pyspark.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from kasper_py._support.closing import close_all
from kasper_py.arrow import import_pyarrow
from kasper_py.config import Config
from kasper_py.exceptions import OffsetError
from kasper_py.kafka.ports import OutputPort
from kasper_py.kafka.producer import OutputProducer
from kasper_py.message import OutgoingRecord
from kasper_py.processor import ProcessorFactory
from kasper_py.spark.records import reader_for
from kasper_py.stores.base import StoreRuntime, StoreSpec
from kasper_py.turn import TurnEngine

__all__ = ["COLUMNS", "STATS_SCHEMA", "PartitionStats", "TaskSpec", "run_task"]

Output = Literal["kafka", "stores"]

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
            for partition, start, stop in _runs(batch.column(1).to_pylist()):
                if runner is None or runner.partition != partition:
                    if runner is not None:
                        done.append(_finish(runner, report))
                    _check_new(partition, done)
                    runner = PartitionRunner(spec, partition, producer)
                runner.feed(batch.slice(start, stop - start))
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
        yield import_pyarrow().RecordBatch.from_pylist([stats.row() for stats in done])


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


class PartitionRunner:
    """Feeds one partition number's messages to the turn engine, ``Config.largest_batch``
    at a time."""

    def __init__(self, spec: TaskSpec, partition: int, producer: OutputProducer) -> None:
        config = spec.config
        self.partition = partition
        self.stats = PartitionStats(partition)
        self._config, self._spec, self._producer = config, spec, producer
        self._started = time.perf_counter()
        self._pending: Any = None
        """Arrow records (a table of ``COLUMNS``) not yet in a turn."""
        self._first: dict[str, int] = {}
        self._last: dict[str, int] = {}
        self._closed = False
        port: OutputPort = producer if spec.output == "kafka" else _Discarded(producer)
        if not spec.stores:
            port = _AckedAtFinish(port)  # nothing waits on the acks before the finish
        # History in bulk: no wall clock, so wall-clock timers never fire and no tasks
        # run; stream time, and its timers, move with the records as in the loop.
        self._engine = TurnEngine(config, port, wall_clock=None)
        try:
            self._engine.open_partition(partition, spec.factory, spec.stores,
                                        StoreRuntime(config, partition, producer))
        except BaseException:
            self.abort()
            raise
        # chosen once: an Arrow processor's records may stay columnar (records.py)
        self._reader = reader_for(config, self._engine.partitions[partition].processor)

    def feed(self, records: Any) -> None:
        """Buffer ``records`` (Arrow records of this partition, ``COLUMNS``); run a turn on
        every full batch."""
        pa, size = import_pyarrow(), self._config.largest_batch
        buffer = pa.Table.from_batches([records])
        if self._pending is not None:
            buffer = pa.concat_tables([self._pending, buffer])
        full = buffer.num_rows - buffer.num_rows % size
        for begin in range(0, full, size):
            self._turn(buffer.slice(begin, size))
        self._pending = buffer.slice(full) if full < buffer.num_rows else None

    def finish(self) -> PartitionStats:
        """Process what is left, wait for every ack, close the processor and stores."""
        if self._pending is not None:
            self._turn(self._pending)
            self._pending = None
        self._producer.wait_for_acks()
        self.abort()
        self.stats.seconds = time.perf_counter() - self._started
        self.stats.ranges = {topic: [self._first[topic], last]
                             for topic, last in sorted(self._last.items())}
        return self.stats

    def abort(self) -> None:
        """Close the processor and the stores without processing more (once; a close
        that fails is logged and the rest still close)."""
        if not self._closed:
            self._closed = True
            close_all(self._engine.close_steps(), self._config.name)

    def _turn(self, records: Any) -> None:
        batch = self._reader.batch(records)
        result = self._engine.run(batch)
        for (topic, _), offsets in batch.ranges.items():
            self._first.setdefault(topic, offsets.first)
            self._last[topic] = offsets.last
        if self._spec.output == "kafka":
            self.stats.produced += result.produced
        else:
            self.stats.discarded += result.produced
        self.stats.messages += len(batch)
        self.stats.undecodable += len(batch.undecodable)
        self.stats.batches += 1


class _Discarded:
    """``output="stores"``: the processor's output is counted, not produced; acks still
    cover what the stores produced themselves (changelogs)."""

    def __init__(self, producer: OutputProducer) -> None:
        self._producer = producer

    def produce(self, messages: Sequence[OutgoingRecord]) -> None:
        pass

    def wait_for_acks(self, waiting: Callable[[], None] | None = None) -> None:
        self._producer.wait_for_acks(waiting)

    def missing_topics(self, topics: Collection[str]) -> dict[str, str]:
        return {}  # nothing is produced to them


class _AckedAtFinish:
    """Without stores nothing depends on a turn's acks before the task ends, so they are
    awaited once per partition (``PartitionRunner.finish``), not once per batch."""

    def __init__(self, port: OutputPort) -> None:
        self._port = port

    def produce(self, messages: Sequence[OutgoingRecord]) -> None:
        self._port.produce(messages)

    def wait_for_acks(self, waiting: Callable[[], None] | None = None) -> None:
        pass

    def missing_topics(self, topics: Collection[str]) -> dict[str, str]:
        return self._port.missing_topics(topics)


def _runs(partitions: Sequence[int]) -> Iterator[tuple[int, int, int]]:
    """(partition, start, stop) of each run of one partition number."""
    if not partitions:
        return
    first = partitions[0]
    if partitions.count(first) == len(partitions):
        yield first, 0, len(partitions)
        return
    start = 0
    for index in range(1, len(partitions) + 1):
        if index == len(partitions) or partitions[index] != partitions[start]:
            yield partitions[start], start, index
            start = index
