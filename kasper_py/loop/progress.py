"""Where a loop stands on its assigned partitions, from the consumer's cached high
watermarks (renewed by every fetch response, so free to read after every turn): the
committed offsets and ends each turn reports, whether everything is consumed; and the
report of a turn (the observer, a log line per partition).
"""

from __future__ import annotations

import logging
from typing import Any

import structlog

from kasper_py.kafka.batching import Batch
from kasper_py.kafka.offsets import OffsetTracker, partition_lag, start_offset
from kasper_py.kafka.ports import InputPort
from kasper_py.message import TopicPartitionKey
from kasper_py.observability.observe import LoopObserver, TurnStats
from kasper_py.turn import TurnResult

__all__ = ["behind", "consumed_all", "progress", "report", "turn_stats"]

_log = structlog.get_logger("kasper_py")



def progress(consumer: InputPort, offsets: OffsetTracker, auto_offset_reset: str
             ) -> tuple[dict[TopicPartitionKey, int], dict[TopicPartitionKey, int]]:
    """Committed offsets (``offsets``, where nothing is committed yet where
    ``auto_offset_reset`` starts) and cached high watermarks of the assigned partitions."""
    committed: dict[TopicPartitionKey, int] = {}
    highs: dict[TopicPartitionKey, int] = {}
    known = offsets.all()
    for tp in consumer.assigned:
        offset = known.get(tp)
        low, high = consumer.watermarks(tp, cached=True)
        if offset is None and low >= 0 and high >= 0:
            # nothing committed yet: the loop starts there (lag is not "no data")
            offset = start_offset(None, low, high, auto_offset_reset)
        if offset is not None:
            committed[tp] = offset
        if high >= 0:
            highs[tp] = high
    return committed, highs


def consumed_all(consumer: InputPort, auto_offset_reset: str) -> bool:
    """True when every assigned partition's next offset reached its high watermark: the
    cached one, with a round trip only for a partition with none cached yet, or of a
    topic the consumer reads from its start (an app's repartitions, which its own turns
    write to)."""
    positions = consumer.positions()
    unknown = [tp for tp, pos in positions.items() if pos is None]
    committed = consumer.committed(unknown) if unknown else {}
    for tp, consumed_to in positions.items():
        internal = tp[0] in consumer.from_start
        low, high = consumer.watermarks(tp, cached=not internal)
        if high < 0:  # no fetch response yet
            low, high = consumer.watermarks(tp)
        position = consumed_to if consumed_to is not None else committed.get(tp)
        if partition_lag(position, low, high, "earliest" if internal else auto_offset_reset):
            return False
    return True


def behind(committed: dict[TopicPartitionKey, int],
           high_watermarks: dict[TopicPartitionKey, int]) -> int | None:
    """Records behind the ``committed`` offsets (those read ahead included), by the
    cached high watermarks; ``None`` when no partition has one yet."""
    if not high_watermarks:
        return None
    waiting = 0
    for tp, high in high_watermarks.items():  # a loop, not a generator: once a turn
        waiting += max(0, high - committed.get(tp, high))
    return waiting


def turn_stats(batch: Batch, result: TurnResult, consumer: InputPort, offsets: OffsetTracker,
               auto_offset_reset: str) -> TurnStats:
    """The stats of a committed turn over ``batch``, with the partitions' ``progress``."""
    return TurnStats(batch, result.produced, result.durations,
                     *progress(consumer, offsets, auto_offset_reset),
                     dead_letters=result.dead_letters)


def report(observer: LoopObserver, stats: TurnStats, processor: str) -> None:
    """Hand a committed turn to ``observer``; log it, one line per input partition."""
    observer.on_turn(stats)
    if not stats.batch.ranges:
        return
    # structlog's lazy proxy binds a logger on every call: bind one for the turn's lines,
    # and skip them when its level filters them out
    log = _log.bind()
    if not _enabled(log, logging.INFO):
        return
    timings = {f"{step}_ms": round(s * 1000, 2) for step, s in stats.durations.items()}
    for (topic, partition), offsets in stats.batch.ranges.items():
        log.info("kasper.batch", processor=processor, topic=topic, partition=partition,
                 first_offset=offsets.first, last_offset=offsets.last,
                 consumed=offsets.count, turn_produced=stats.produced, **timings)


def _enabled(log: Any, level: int) -> bool:
    """Whether ``log`` emits ``level``: asked of a filtering bound logger (structlog's
    default); any other logger is taken to emit it."""
    is_enabled_for = getattr(log, "is_enabled_for", None)
    return True if is_enabled_for is None else bool(is_enabled_for(level))
