"""The loop's partitions on its turn engine, as an assignment opens and closes them:
each opened with its stores restored and its processor built by the factory, closed
when revoked, and (exactly-once with an effectively-once store) told where the loop
starts. Which partitions are the assignment's (``assignment.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kasper_py._support.closing import close_all
from kasper_py.config import Config
from kasper_py.kafka.offsets import start_offset
from kasper_py.kafka.ports import KafkaClients
from kasper_py.message import TopicPartitionKey
from kasper_py.observability.observe import NoopStoreObserver, StoreObserver, StoreObservers
from kasper_py.processor import ProcessorFactory
from kasper_py.stores.base import StoreRuntime, StoreSpec
from kasper_py.turn import TurnEngine

__all__ = ["Partitions", "RestoreTally"]


class RestoreTally(NoopStoreObserver):
    """Counts what the restores of one open read: records, and whether every table
    started from a standby's warm copy."""

    def __init__(self) -> None:
        self.records, self.tables, self.from_standby = 0, 0, 0

    def on_restore_done(self, store: str, partition: int, records: int, seconds: float,
                        from_standby: bool) -> None:
        self.records += records
        self.tables += 1
        self.from_standby += from_standby


class Partitions:
    """Opens and closes partitions of ``engine``: ``factory``'s processors on the stores
    of ``stores``, which report to ``store_observer``."""

    def __init__(self, config: Config, clients: KafkaClients, engine: TurnEngine, *,
                 factory: ProcessorFactory, stores: Sequence[StoreSpec],
                 store_observer: Callable[[], StoreObserver]) -> None:
        self.config = config
        self._consumer, self._producer = clients.consumer, clients.producer
        self._engine, self._factory, self._stores = engine, factory, list(stores)
        self._store_observer = store_observer

    def open(self, partitions: Sequence[int], tally: RestoreTally | None = None) -> None:
        """Open each of ``partitions`` not open yet: restore its stores, build its
        processor. ``tally`` also hears the restores (what a promotion reports)."""
        for partition in partitions:
            if partition not in self._engine.partitions:
                observer = self._store_observer()
                runtime = StoreRuntime(self.config, partition, self._producer,
                                       observer if tally is None
                                       else StoreObservers(observer, tally))
                self._engine.open_partition(partition, self._factory, self._stores, runtime)

    def is_open(self, partition: int) -> bool:
        """Whether ``partition`` is open here."""
        return partition in self._engine.partitions

    def close(self, partitions: Sequence[int]) -> None:
        """Close ``partitions``' processors and stores; the others stay open."""
        steps = [step for p in partitions for step in self._engine.close_partition(p)]
        close_all(steps, self.config.name)

    def record_starts(self, committed: dict[TopicPartitionKey, int | None]) -> None:
        """Exactly-once with an effectively-once store: where the store has recorded
        nothing, record where the loop starts (the ``committed`` offset, else where
        ``auto_offset_reset`` points), so the store always knows where it stands."""
        unrecorded = self._engine.unrecorded(list(committed))
        if not unrecorded:
            return
        starts = {}
        for tp in unrecorded:
            offset = committed.get(tp)
            if offset is None:
                offset = start_offset(None, *self._consumer.watermarks(tp),
                                      "earliest" if tp[0] in self._consumer.from_start
                                      else self.config.auto_offset_reset)
            starts[tp] = offset
        self._engine.record(starts)

    def resume_from(self) -> dict[TopicPartitionKey, int]:
        """Where effectively-once stores stand below the committed offsets
        (``TurnEngine.resume_from``)."""
        return self._engine.resume_from()
