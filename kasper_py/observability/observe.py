"""The ports the loop and its stores report through, and their no-op defaults:
``LoopObserver`` (turns, idling, errors, the lead, the alignment of inputs) and
``StoreObserver`` (store operations, changelog restores, late records dropped by windows,
records a DSL operator skipped).
Prometheus lives in ``metrics.py`` and is imported only there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from kasper_py.message import TopicPartitionKey

if TYPE_CHECKING:
    from kasper_py.kafka.alignment import AlignmentReport
    from kasper_py.kafka.batching import Batch
    from kasper_py.message import DeadLetter

__all__ = [
    "NOOP_STORE_OBSERVER",
    "LoopObserver",
    "NoopObserver",
    "NoopStoreObserver",
    "StoreObserver",
    "StoreObservers",
    "TurnStats",
    "with_store_observer",
]

@dataclass
class TurnStats:
    """One completed (committed) turn: its input, its output and how long each step took."""

    batch: Batch
    produced: int
    durations: dict[str, float] = field(default_factory=dict)
    """Seconds per timed step (``kasper_py.steps.TIMED``): process, flush, produce,
    read_ahead, commit."""
    committed: dict[TopicPartitionKey, int] = field(default_factory=dict)
    """Next offset to read per assigned (topic, partition), as committed so far; where
    nothing is committed yet, where ``auto_offset_reset`` starts (from the watermarks)."""
    high_watermarks: dict[TopicPartitionKey, int] = field(default_factory=dict)
    """Latest known high watermark per assigned (topic, partition), from fetch responses."""
    dead_letters: list[DeadLetter] = field(default_factory=list)
    """Input the turn set aside: undecodable records (reason ``decode``) and messages
    ``process()`` failed on (reason ``process``)."""
    batch_size_target: int | None = None
    """The most records the next batch may take: ``Config.largest_batch``, or with
    ``max_latency`` what the loop's batch controller chose after this turn."""


class StoreObserver(Protocol):
    """Receives what the stores of one processor report; handed to each store at open."""

    def on_store_op(self, store: str, op: str, seconds: float, round_trips: int) -> None:
        """Store ``store`` ran ``op`` (``get_many``, ``flush``, ``open``) in ``seconds``,
        waiting on its backend ``round_trips`` times (retries included)."""

    def on_restore_started(self, store: str, partition: int, records: int) -> None:
        """``store``'s ``partition`` is being brought level with its changelog, which
        takes ``records`` records (0: the local copy was up to date). Once per open of
        a store partition: a partition kept through a rebalance reports nothing."""

    def on_restore_progress(self, store: str, partition: int, restored: int,
                            total: int) -> None:
        """A changelog restore of ``store`` for ``partition`` has applied ``restored``
        of ``total`` records (``total`` 0: nothing to restore)."""

    def on_late_records(self, store: str, count: int) -> None:
        """The windows of ``store`` dropped ``count`` records that arrived after their
        window closed (stream time past the window's end plus its grace period)."""

    def on_keys_expired(self, store: str, count: int) -> None:
        """``store`` removed ``count`` keys whose time to live (``ttl=``) had passed."""

    def on_records_skipped(self, store: str, partition: int, reason: str, count: int) -> None:
        """The operator keeping ``store`` (a DSL join or windowed aggregation) skipped
        ``count`` records of ``partition`` it cannot take, for ``reason``: ``null_key``
        or ``null_value`` (Kafka Streams' rule for joins and aggregations)."""

    def on_table_size(self, store: str, partition: int, keys: int) -> None:
        """``store``'s ``partition`` holds about ``keys`` keys (after a turn applied its
        writes; where the backend reports it: a local RocksDB table)."""

    def on_restore_done(self, store: str, partition: int, records: int, seconds: float,
                        from_standby: bool) -> None:
        """``store``'s ``partition`` is level with its changelog after reading ``records``
        records in ``seconds``; ``from_standby``: its files were a standby's warm copy."""

    def on_standby_lag(self, store: str, partition: int, offset: int, records: int,
                       seconds: float) -> None:
        """This process's warm copy of ``store``'s ``partition`` has applied its changelog
        up to ``offset`` (the next to read), ``records`` offsets behind its end, and was
        last level ``seconds`` ago (0 when level)."""

    def on_standby_stopped(self, store: str, partition: int) -> None:
        """This process no longer keeps ``store``'s ``partition`` warm (promoted here, or
        placed elsewhere): it reports no lag for it from now on."""


class NoopStoreObserver:
    """Observes nothing: what a store reports to when no one listens."""

    def on_store_op(self, store: str, op: str, seconds: float, round_trips: int) -> None:
        pass

    def on_restore_started(self, store: str, partition: int, records: int) -> None:
        pass

    def on_restore_progress(self, store: str, partition: int, restored: int,
                            total: int) -> None:
        pass

    def on_late_records(self, store: str, count: int) -> None:
        pass

    def on_keys_expired(self, store: str, count: int) -> None:
        pass

    def on_records_skipped(self, store: str, partition: int, reason: str, count: int) -> None:
        pass

    def on_table_size(self, store: str, partition: int, keys: int) -> None:
        pass

    def on_restore_done(self, store: str, partition: int, records: int, seconds: float,
                        from_standby: bool) -> None:
        pass

    def on_standby_lag(self, store: str, partition: int, offset: int, records: int,
                       seconds: float) -> None:
        pass

    def on_standby_stopped(self, store: str, partition: int) -> None:
        pass


NOOP_STORE_OBSERVER = NoopStoreObserver()


class StoreObservers:
    """Hands every store report to each of ``observers``, in order."""

    def __init__(self, *observers: StoreObserver) -> None:
        self.observers = observers

    def on_store_op(self, store: str, op: str, seconds: float, round_trips: int) -> None:
        for observer in self.observers:
            observer.on_store_op(store, op, seconds, round_trips)

    def on_restore_started(self, store: str, partition: int, records: int) -> None:
        for observer in self.observers:
            observer.on_restore_started(store, partition, records)

    def on_restore_progress(self, store: str, partition: int, restored: int,
                            total: int) -> None:
        for observer in self.observers:
            observer.on_restore_progress(store, partition, restored, total)

    def on_late_records(self, store: str, count: int) -> None:
        for observer in self.observers:
            observer.on_late_records(store, count)

    # An observer written before these five were added lacks them: it hears none.
    def on_keys_expired(self, store: str, count: int) -> None:
        self._to_those_with("on_keys_expired", store, count)

    def on_records_skipped(self, store: str, partition: int, reason: str, count: int) -> None:
        self._to_those_with("on_records_skipped", store, partition, reason, count)

    def on_table_size(self, store: str, partition: int, keys: int) -> None:
        self._to_those_with("on_table_size", store, partition, keys)

    def on_restore_done(self, store: str, partition: int, records: int, seconds: float,
                        from_standby: bool) -> None:
        self._to_those_with("on_restore_done", store, partition, records, seconds,
                            from_standby)

    def on_standby_lag(self, store: str, partition: int, offset: int, records: int,
                       seconds: float) -> None:
        self._to_those_with("on_standby_lag", store, partition, offset, records, seconds)

    def on_standby_stopped(self, store: str, partition: int) -> None:
        self._to_those_with("on_standby_stopped", store, partition)

    def _to_those_with(self, method: str, *args: object) -> None:
        for observer in self.observers:
            report = getattr(observer, method, None)
            if report is not None:
                report(*args)


class LoopObserver(Protocol):
    """Receives the loop's events; metrics and health implement it."""

    def on_start(self, assigned: list[TopicPartitionKey]) -> None:
        """Partitions are assigned and stores restored; processing begins."""

    def on_turn(self, stats: TurnStats) -> None:
        """A turn was committed."""

    def on_idle(self) -> None:
        """A poll returned nothing, or a turn is still waiting for its acks (about once
        a second, up to ``delivery_timeout``): the loop is alive."""

    def on_transaction(self, result: str, seconds: float) -> None:
        """Exactly-once: a transaction ended, ``committed`` (its commit took ``seconds``)
        or ``aborted``."""

    def on_error(self, error: BaseException) -> None:
        """The loop is stopping on ``error``."""

    def on_stop(self) -> None:
        """The loop has stopped."""

    def on_query_rejected(self, reason: str) -> None:
        """The query server refused a request with 401: ``missing`` (no bearer token) or
        ``wrong`` (another token)."""

    def on_leader(self, leading: bool) -> None:
        """This process began (``True``) or ceased (``False``) to lead its app's
        processes (``kasper_py.loop.leader``); called from the elector's thread, and
        only when it runs leader-only tasks on Kafka."""

    def store_observer(self) -> StoreObserver:
        """Where the loop's stores report; handed to each store when it is opened."""
        return NOOP_STORE_OBSERVER

    def watch_processors(self, read: Callable[[], Mapping[str, tuple[int, float]]]) -> None:
        """The loop runs an app: ``read()`` gives, per processor of the app, the messages
        handed to it and the seconds it spent in ``process()`` so far."""

    def watch_alignment(self, read: Callable[[], AlignmentReport]) -> None:
        """The loop aligns co-partitioned inputs by timestamp (``Config.max_task_idle``):
        ``read()``, from any thread, gives what the alignment waited for so far and holds
        now (``kafka.alignment.AlignmentReport``)."""


class NoopObserver:
    """Observes nothing: the default when metrics are disabled."""

    def on_start(self, assigned: list[TopicPartitionKey]) -> None:
        pass

    def on_turn(self, stats: TurnStats) -> None:
        pass

    def on_idle(self) -> None:
        pass

    def on_transaction(self, result: str, seconds: float) -> None:
        pass

    def on_error(self, error: BaseException) -> None:
        pass

    def on_stop(self) -> None:
        pass

    def on_query_rejected(self, reason: str) -> None:
        pass

    def on_leader(self, leading: bool) -> None:
        pass

    def store_observer(self) -> StoreObserver:
        return NOOP_STORE_OBSERVER

    def watch_processors(self, read: Callable[[], Mapping[str, tuple[int, float]]]) -> None:
        pass

    def watch_alignment(self, read: Callable[[], AlignmentReport]) -> None:
        pass


class _WithStoreObserver:
    """``loop``, whose stores also report to ``extra``."""

    def __init__(self, loop: LoopObserver, extra: StoreObserver) -> None:
        self._loop = loop
        self._stores = StoreObservers(loop.store_observer(), extra)

    def on_start(self, assigned: list[TopicPartitionKey]) -> None:
        self._loop.on_start(assigned)

    def on_turn(self, stats: TurnStats) -> None:
        self._loop.on_turn(stats)

    def on_idle(self) -> None:
        self._loop.on_idle()

    def on_transaction(self, result: str, seconds: float) -> None:
        self._loop.on_transaction(result, seconds)

    def on_error(self, error: BaseException) -> None:
        self._loop.on_error(error)

    def on_stop(self) -> None:
        self._loop.on_stop()

    def on_query_rejected(self, reason: str) -> None:
        self._loop.on_query_rejected(reason)

    def on_leader(self, leading: bool) -> None:
        self._loop.on_leader(leading)

    def store_observer(self) -> StoreObserver:
        return self._stores

    def watch_processors(self, read: Callable[[], Mapping[str, tuple[int, float]]]) -> None:
        self._loop.watch_processors(read)

    def watch_alignment(self, read: Callable[[], AlignmentReport]) -> None:
        self._loop.watch_alignment(read)


def with_store_observer(loop: LoopObserver, extra: StoreObserver) -> LoopObserver:
    """``loop`` for every loop event, with its stores also reporting to ``extra``
    (a restore progress display, say)."""
    return _WithStoreObserver(loop, extra)
