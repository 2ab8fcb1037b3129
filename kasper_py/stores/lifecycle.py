"""What the turn engine calls on a store (``StoreLifecycle``: flush, undo, the turn
done, effectively-once offsets, close) and the effectively-once rules it applies
(``already_applied``, ``check_effectively_once_alone``). A processor's calls are in
base.py, queries' in query.py.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping

import structlog

from kasper_py.exceptions import StoreError
from kasper_py.kafka.batching import Batch
from kasper_py.message import TopicPartitionKey

__all__ = ["AppliedInput", "StoreLifecycle", "already_applied", "check_effectively_once_alone"]

_log = structlog.get_logger("kasper_py")


class StoreLifecycle(ABC):
    """A store as the turn engine drives it: once per turn ``flush`` (or
    ``discard_pending`` when the turn fails), then ``after_delivery`` once it is
    committed; ``savepoint``/``rollback`` around one partition's ``process()``; the
    offsets an effectively-once store applied; ``close``. ``TurnEngine`` calls stores
    through this interface only."""

    effectively_once: bool = False
    """True when ``flush`` records the input offsets atomically with the writes; the
    loop then acks outputs before flushing and skips input the store already applied."""

    @abstractmethod
    def flush(self, next_offsets: Mapping[TopicPartitionKey, int]) -> None:
        """Write the buffered changes out. ``next_offsets`` are the input offsets the
        turn will commit for this partition (stores that apply effectively-once keep them)."""

    @abstractmethod
    def discard_pending(self) -> None:
        """Drop the buffered writes, as a failed turn does."""

    def savepoint(self) -> object:
        """A mark of the buffered writes as they are now, for ``rollback``: with
        ``Config.on_process_error="dead_letter"`` the turn undoes one partition's writes
        since a point of the turn, keeping what timers wrote before it. A store that
        buffers nothing returns anything and ignores ``rollback``."""
        raise NotImplementedError(f"{type(self).__name__} cannot undo part of a turn's "
                                  "writes (savepoint/rollback), which "
                                  "on_process_error='dead_letter' needs")

    def rollback(self, savepoint: object) -> None:
        """Put the buffered writes back as they were at ``savepoint`` (this store's own)."""
        raise NotImplementedError(f"{type(self).__name__} cannot undo part of a turn's writes")

    def after_delivery(self) -> None:  # noqa: B027 - optional hook
        """Called once the turn is committed (every output and changelog message acked,
        the offsets or the transaction committed): local tables apply their writes here;
        one that fails now is behind its changelog and reads the difference back at its
        next open."""

    def applied_offsets(self) -> Mapping[TopicPartitionKey, int]:
        """Next input offsets already applied to this store; replayed messages below
        them are skipped. Empty unless the store is effectively-once."""
        return {}

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections or files."""


def already_applied(applied: Mapping[TopicPartitionKey, int],
                    next_offsets: Mapping[TopicPartitionKey, int]) -> bool:
    """True when an effectively-once store already holds every offset of the batch
    (a replayed batch, whose writes must not be applied twice)."""
    return bool(next_offsets) and all(
        applied.get(tp, -1) >= offset for tp, offset in next_offsets.items())


def check_effectively_once_alone(stores: Mapping[str, StoreLifecycle]) -> None:
    """Refuse an effectively-once store beside other stores of one partition: replay
    skips the input its offsets cover, which the other stores may not have applied."""
    exact = [name for name, store in stores.items() if store.effectively_once]
    if exact and len(stores) > 1:
        raise StoreError(
            f"store {exact[0]!r} is effectively-once, so it must be the processor's only "
            f"store (got {sorted(stores)}): replay skips input its offsets cover, which "
            "the other stores may not have applied")


class AppliedInput:
    """Input the effectively-once stores already applied, which the turn engine skips
    when it comes again (a replayed batch): per topic-partition, the lowest next offset
    a store recorded (skipping less replays, skipping more loses)."""

    def __init__(self, processor: str) -> None:
        self.processor = processor
        self.below: dict[TopicPartitionKey, int] = {}
        """Input below these offsets is skipped; empty once the turns passed them."""

    def note(self, tp: TopicPartitionKey, offset: int) -> None:
        """A store applied ``tp``'s input up to ``offset`` (exclusive)."""
        self.below[tp] = min(offset, self.below.get(tp, offset))

    def drop(self, batch: Batch) -> None:
        """Skip the batch's messages and undecodable records the stores hold already."""
        below = self.below
        for partition, messages in list(batch.by_partition.items()):
            kept = [m for m in messages if m.offset >= below.get((m.topic, partition), -1)]
            skipped = len(messages) - len(kept)
            if skipped:
                _log.info("kasper.skipped_applied", processor=self.processor,
                          partition=partition, skipped=skipped)
            if kept:
                batch.by_partition[partition] = kept
            else:
                del batch.by_partition[partition]
        batch.undecodable = [r for r in batch.undecodable
                             if r.offset >= below.get((r.topic, r.partition), -1)]

    def forget(self, next_offsets: Mapping[TopicPartitionKey, int]) -> None:
        """A turn committed ``next_offsets``: what they pass needs no skipping."""
        if not self.below:  # the common case: nothing is skipped
            return
        for tp, next_offset in next_offsets.items():
            if next_offset >= self.below.get(tp, next_offset + 1):
                del self.below[tp]

    def forget_partition(self, partition: int) -> None:
        """``partition`` left this process."""
        for tp in [tp for tp in self.below if tp[1] == partition]:
            del self.below[tp]
