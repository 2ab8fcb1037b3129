"""The prefetcher: what the loop reads next. It gathers each batch from the consumer
(``batching.Collector``: until full or ``batch_wait`` is over), sized by the rule
chosen at start (``sizing``: Kasper's fixed batches, or with ``Config.max_latency`` a
``BatchController`` learning from the last turns), and reads the next batch while a
turn's acks are outstanding. A batch read ahead is never processed, nor committed,
before its own turn.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Protocol

import structlog

from kasper_py.config import Config
from kasper_py.exceptions import KasperError
from kasper_py.kafka.alignment import UNALIGNED, TimestampAlignment, consumer_lags
from kasper_py.kafka.batching import Batch, Collector, build_batch
from kasper_py.kafka.ports import KafkaClients
from kasper_py.kafka.sizing import (
    EXACTLY_ONCE_LOCALITY,
    LOCALITY_BYTES,
    BatchController,
    FixedBatches,
    SampledBytes,
    Sizing,
)
from kasper_py.loop.progress import behind
from kasper_py.message import TopicPartitionKey
from kasper_py.observability.observe import TurnStats

__all__ = ["Prefetcher", "Schedule"]

_log = structlog.get_logger("kasper_py")

_AHEAD_STEP = 0.005
"""Longest a consume waits while reading ahead: acks that arrive meanwhile delay the
commit by at most this much. With ``max_latency``, a fiftieth of it at most."""
_DUE_STEP = 0.001
"""Shortest consume wait while a wall-clock timer or task is due (it then ends the
batch at once)."""


class Schedule(Protocol):
    """When the next wall-clock timer or task falls due (``kasper_py.turn``'s keeper)."""

    def due(self) -> bool:
        """True when one is due now."""

    def seconds_until_due(self) -> float | None:
        """Seconds until the next is due; ``None`` when none is scheduled."""


class Prefetcher:
    """Reads the batches of one loop from the consumer of ``clients``, its ``batch_wait``
    and turns timed on their clock; their producer tells when a turn's acks are in
    (reading ahead stops then)."""

    def __init__(self, config: Config, clients: KafkaClients,
                 internal: Collection[str] = ()) -> None:
        """``internal``: input topics the loop writes itself (an app's repartitions),
        left out of the alignment of co-partitioned inputs."""
        self.config = config
        self._consumer, self._producer, self._clock = (clients.consumer, clients.producer,
                                                       clients.clock)
        self._sizing = _sizing(config)
        """Sizes each batch (and its linger); with ``max_latency``, from the last turns."""
        self._controller = self._sizing if isinstance(self._sizing, BatchController) else None
        self.alignment = _alignment(config, clients, internal)
        """The timestamp alignment of co-partitioned inputs (its ``report()`` is what the
        metrics show of it); ``None``: not aligned, every record read goes."""
        self._collector = Collector(
            clients.consumer.consume, self._sizing.size, config.batch_wait, clients.clock,
            weigh=None if config.max_latency is None else SampledBytes(),
            alignment=self.alignment or UNALIGNED)
        self._ahead_step = (_AHEAD_STEP if config.max_latency is None
                            else min(_AHEAD_STEP, config.max_latency / 50))
        self._handed_out = clients.clock()
        """When the batch in hand was handed out (on the clients' clock)."""
        self._resize()
        self._ahead: Batch | KasperError | None = None
        """The next batch, read (or failed to read) while the last turn's acks were
        outstanding."""
        self._serdes = (config.key_decoder, config.value_decoder)
        """The key and value serdes, resolved once (a custom one's check costs ~13 µs)."""
        topics = config.input_topics
        self._only_topic = topics[0] if len(topics) == 1 else None

    @property
    def size(self) -> int:
        """The most records the next batch may take."""
        return self._collector.size

    def holding(self) -> bool:
        """True while records of the next batch are read and not yet processed."""
        return bool(self._collector.records) or self._ahead is not None

    def next_batch(self, schedule: Schedule) -> Batch:
        """The batch read ahead, else the next one gathered now (ended early when a
        wall-clock timer or task of ``schedule`` falls due). A batch whose reading
        failed raises now: it is this turn's failure, not the last one's."""
        batch, self._ahead = self._ahead, None
        if isinstance(batch, KasperError):
            raise batch
        if batch is None:
            wait = schedule.seconds_until_due()
            if wait is None:
                self._collector.gather()
            else:
                self._collector.gather(until=schedule.due, step=max(wait, _DUE_STEP))
            batch = self._take()
        self._handed_out = self._clock()
        return batch

    def read_ahead(self) -> None:
        """While a turn's acks are outstanding, read the next batch: consume until the
        acks are in or the batch is ready, and decode a ready one. A Kafka or decoding
        error is kept for the next turn, which fails with it; this turn goes on."""
        try:
            # With max_latency a batch its linger released is finished after the turn,
            # taking along what arrived until then; a full one is decoded now.
            ready = self._collector.gather(until=self._all_acked, step=self._ahead_step)
            if ready and (self._collector.linger is None or self._collector.full):
                batch = self._take()
                self._ahead = batch if batch.ranges else None  # batch_wait over, nothing read
        except KasperError as exc:
            self._ahead = exc

    def drop(self, keys: Iterable[TopicPartitionKey]) -> None:
        """Forget records gathered of ``keys`` (partitions revoked)."""
        self._collector.drop(set(keys))

    def observe(self, stats: TurnStats) -> None:
        """A turn is done: the sizing rule learns from it (its batch, the records known
        to wait, its seconds since the batch was handed out, its outputs); ``stats``
        gets the size the next batch may take."""
        counted = self._controller and self._controller.probe.outputs_per_input
        self._sizing.observe(len(stats.batch), behind(stats.committed, stats.high_watermarks),
                             self._clock() - self._handed_out, stats.produced)
        if self._controller and self._controller.probe.outputs_per_input is not counted:
            self._report_bound(self._controller)
        self._resize()
        stats.batch_size_target = self._collector.size

    def _report_bound(self, controller: BatchController) -> None:
        """The backlog's batch sizes were just compared: say which one drains it."""
        probe = controller.probe
        assert probe.outputs_per_input is not None  # set by the comparison
        at_largest, at_bound = probe.outputs_per_input
        _log.info("kasper.batch_bound", processor=self.config.name,
                  batches=controller.locality if probe.capped else controller.ceiling,
                  bound=controller.locality, largest=controller.ceiling,
                  outputs_per_input_largest=float(f"{at_largest:.3g}"),
                  outputs_per_input_bound=float(f"{at_bound:.3g}"),
                  coalesces=not probe.capped)

    def _resize(self) -> None:
        """The next batch's size, bytes and linger, from the sizing rule."""
        sizing, collector = self._sizing, self._collector
        collector.size, collector.max_bytes, collector.linger = (
            sizing.size, sizing.max_bytes, sizing.linger)

    def _take(self) -> Batch:
        """The gathered records, weighed for the sizing rule, decoded."""
        nbytes, records = self._collector.bytes, self._collector.take()
        self._sizing.weigh(len(records), nbytes - self._collector.bytes)
        return build_batch(records, *self._serdes,
                           self._consumer.transient_error,
                           set_aside=self.config.on_decode_error != "fail",
                           keep_read=self.config.on_process_error == "dead_letter",
                           only_topic=self._only_topic)

    def _all_acked(self) -> bool:
        return self._producer.outstanding() == 0


def _alignment(config: Config, clients: KafkaClients,
               internal: Collection[str]) -> TimestampAlignment | None:
    """With two input topics or more (not counting ``internal`` ones) and
    ``max_task_idle`` set, batches cut at a common timestamp frontier per partition
    number (``alignment.TimestampAlignment``); else none: every record read goes."""
    topics = [t for t in config.input_topics if t not in internal]
    if len(topics) < 2 or config.max_task_idle is None:
        return None
    consumer = clients.consumer
    return TimestampAlignment(topics, consumer_lags(consumer.positions, consumer.watermarks),
                              clients.clock, config.max_task_idle, config.largest_batch,
                              fetching=consumer)


def _sizing(config: Config) -> Sizing:
    """Kasper's fixed batches without ``max_latency``; a controller with it."""
    if config.max_latency is None:
        return FixedBatches(config.largest_batch)
    locality = LOCALITY_BYTES * (EXACTLY_ONCE_LOCALITY if config.exactly_once else 1)
    return BatchController(config.max_latency, config.largest_batch,
                           largest_bytes=config.batch_bytes, locality_bytes=locality)
