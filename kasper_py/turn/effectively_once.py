"""The effectively-once bookkeeping of one turn engine: which input its stores already
applied (skipped when a batch is replayed), whether a turn's outputs must be acked
before the stores flush, and, under exactly-once, where the stores stand at start
(``unrecorded``, ``record``, ``resume_from``). The stores record their offsets
themselves (``StoreLifecycle.flush``); this part only keeps the engine's side.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kasper_py.kafka.batching import Batch
from kasper_py.message import TopicPartitionKey
from kasper_py.stores.lifecycle import AppliedInput, StoreLifecycle, check_effectively_once_alone
from kasper_py.turn.partitions import PartitionState, store_call

__all__ = ["EffectivelyOnce", "OpenStore"]

OpenStore = tuple[int, str, StoreLifecycle]
"""(partition, name, store) of an open store."""


class EffectivelyOnce:
    """What the engine's effectively-once stores applied, and what that asks of a turn.
    ``exactly_once``: the turns run in transactions (the stores then record after the
    transaction commits)."""

    def __init__(self, processor: str, *, exactly_once: bool) -> None:
        self._applied = AppliedInput(processor)
        self._exactly_once = exactly_once
        self.outputs_first = False
        """Some open store is effectively-once: a turn's outputs are acked (exactly-once:
        committed) before the stores flush, so a store records offsets whose outputs
        are visible."""

    def opened_store(self, store: StoreLifecycle) -> None:
        """``store`` was opened: input below its applied offsets is skipped. The lowest
        applied offset counts: skipping less replays, skipping more loses."""
        for tp, offset in store.applied_offsets().items():
            self._applied.note(tp, offset)

    def opened(self, state: PartitionState) -> None:
        """Every store of ``state`` is open. Raises ``ConfigError`` when an
        effectively-once store shares its partition with another store."""
        check_effectively_once_alone(state.stores)
        self.outputs_first = self.outputs_first or any(
            store.effectively_once for store in state.stores.values())

    def skip_applied(self, batch: Batch) -> None:
        """Drop from ``batch`` the input the stores applied already (a replayed batch)."""
        if self._applied.below:
            self._applied.drop(batch)

    def committed(self, next_offsets: Mapping[TopicPartitionKey, int]) -> None:
        """A turn committed ``next_offsets``: input they pass needs no skipping."""
        self._applied.forget(next_offsets)

    def forget_partition(self, partition: int) -> None:
        """``partition`` left the engine."""
        self._applied.forget_partition(partition)

    def unrecorded(self, stores: Sequence[OpenStore],
                   keys: Sequence[TopicPartitionKey]) -> list[TopicPartitionKey]:
        """Exactly-once with effectively-once stores: the topic-partitions of ``keys``
        for which a store has recorded no applied offset yet (see ``record``)."""
        if not self._exactly_once:
            return []
        return [tp for p, _, store in stores if store.effectively_once
                for tp in keys if tp[1] == p and tp not in store.applied_offsets()]

    def record(self, stores: Sequence[OpenStore],
               starts: Mapping[TopicPartitionKey, int]) -> None:
        """Record ``starts`` as applied in every effectively-once store lacking them,
        before the first turn. A turn's transaction commits before its store write; if
        a store's first write failed after that, a restart must find where the store
        stands (here) to process the batch again, not the committed offsets past it."""
        for partition, name, store in stores:
            mine = {tp: o for tp, o in starts.items() if tp[1] == partition}
            if store.effectively_once and mine:
                store_call(name, partition, store.flush, mine)
                for tp, offset in mine.items():
                    self._applied.note(tp, offset)

    def resume_from(self) -> dict[TopicPartitionKey, int]:
        """Exactly-once with an effectively-once store: the input offsets the stores have
        applied. A turn's transaction (outputs and offsets) commits before its store
        flush, so a crash between the two leaves the store behind the committed offsets;
        the runner starts from here where lower, and that input is processed again
        (its outputs twice). Empty otherwise."""
        return dict(self._applied.below) if self._exactly_once else {}
