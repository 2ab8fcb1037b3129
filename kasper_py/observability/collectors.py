"""The Prometheus collectors of one processor (``Collectors``): its counters, histograms
and gauges, in one registry, and how a turn, a dead letter and a store operation count;
and ``AlignmentCollector``, the alignment of its inputs read when scraped. ``metrics.py``
builds them for an observer and serves them; prometheus_client is imported only when
they are built.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from kasper_py import exceptions
from kasper_py.observability.observe import TurnStats
from kasper_py.steps import TIMED

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

    from kasper_py.kafka.alignment import AlignmentReport
    from kasper_py.message import DeadLetter

__all__ = ["INSTALL_HINT", "NAMESPACE", "AlignmentCollector", "Collectors", "import_prometheus"]

NAMESPACE = "kasper"
INSTALL_HINT = "pip install 'kasper-py[prometheus]'"

_BATCH_BUCKETS = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 50000, 100000)
_SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                    1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def import_prometheus() -> Any:
    try:
        import prometheus_client  # noqa: PLC0415 - optional extra, imported on use
    except ImportError as exc:
        raise ImportError(
            f"kasper_py metrics need prometheus-client, which is not installed: {INSTALL_HINT}"
        ) from exc
    return prometheus_client


class Collectors:
    """The counters, histograms and gauges of one processor, in one registry."""

    def __init__(self, processor: str, registry: CollectorRegistry | None,
                 decode_policy: str = "fail", guarantee: str = "at_least_once") -> None:
        prom = import_prometheus()
        self.processor = processor
        self.decode_policy = decode_policy
        self.dead_letter_reasons = {"process"} | (
            {"decode"} if decode_policy == "dead_letter" else set())
        self.registry: CollectorRegistry = registry or prom.CollectorRegistry()
        common: dict[str, Any] = {"namespace": NAMESPACE, "registry": self.registry}
        self._add_turn_collectors(prom, common)
        self._add_guarantee_collectors(prom, common, guarantee)
        self._add_client_collectors(prom, common)
        self._add_store_collectors(prom, common)
        self._initialize()

    def _add_turn_collectors(self, prom: Any, common: dict[str, Any]) -> None:
        tp = ["processor", "topic", "partition"]
        self.consumed = prom.Counter(
            "messages_consumed", "Input messages processed and committed.", tp, **common)
        self.produced = prom.Counter(
            "messages_produced", "Output messages produced and acked.", ["processor"], **common)
        self.turns = prom.Counter(
            "turns", "Committed turns of the loop.", ["processor"], **common)
        self.errors = prom.Counter(
            "errors", "Errors that stopped the loop or were skipped, by type.",
            ["processor", "type"], **common)
        self.skipped = prom.Counter(
            "messages_skipped", "Records skipped, by reason: input messages that did not "
            "decode (decode), committed without processing by on_decode_error (skip or "
            "dead_letter); records a DSL join or aggregation cannot take (null_key, "
            "null_value; topic empty).", [*tp, "policy", "reason"], **common)
        self.dead_letters = prom.Counter(
            "dead_letters", "Input messages produced to the dead-letter topic, by reason: "
            "decode (on_decode_error) or process (on_process_error).",
            ["processor", "reason"], **common)
        self.batch_size = prom.Histogram(
            "batch_size_messages", "Messages per committed turn.", ["processor"],
            buckets=_BATCH_BUCKETS, **common)
        self.step_seconds = prom.Histogram(
            "step_duration_seconds", "Seconds per step of a turn: process, flush, produce, "
            "read_ahead, commit.", ["processor", "step"], buckets=_SECONDS_BUCKETS, **common)
        self.batch_target = prom.Gauge(
            "batch_size_target", "The most messages the next batch may take: batch_size, "
            "or with max_latency what the batch controller chose (within batch_size and "
            "batch_bytes).", ["processor"], **common)
        self.last_turn = prom.Gauge(
            "last_turn_timestamp_seconds", "Unix time of the last committed turn.",
            ["processor"], **common)
        self.leader = prom.Gauge(
            "leader", "1 while this process leads its app's processes and runs its "
            "leader-only tasks (only processes that run such tasks export it).",
            ["processor"], **common)

    def _add_guarantee_collectors(self, prom: Any, common: dict[str, Any],
                                  guarantee: str) -> None:
        self.guarantee = prom.Gauge(
            "processing_guarantee", "1 for the processing guarantee the loop runs with.",
            ["processor", "guarantee"], **common)
        self.guarantee.labels(self.processor, guarantee).set(1)
        self.transactions = prom.Counter(
            "transactions", "Exactly-once transactions by result: committed, aborted.",
            ["processor", "result"], **common)
        self.transaction_seconds = prom.Histogram(
            "transaction_commit_seconds", "Exactly-once: seconds to add the input offsets "
            "to a transaction and commit it.", ["processor"], buckets=_SECONDS_BUCKETS,
            **common)

    def _add_client_collectors(self, prom: Any, common: dict[str, Any]) -> None:
        self.client_logs = prom.Counter(
            "client_log_messages", "Log lines of the Kafka clients (librdkafka), by the "
            "level they are logged at; repeats held back from the log count too.",
            ["processor", "client", "level"], **common)
        self.query_rejected = prom.Counter(
            "query_requests_rejected", "Requests to the query server (tables, views) "
            "refused with 401, by reason: missing (no bearer token) or wrong (another).",
            ["processor", "reason"], **common)

    def _add_store_collectors(self, prom: Any, common: dict[str, Any]) -> None:
        store = ["processor", "store", "op"]
        self.store_seconds = prom.Histogram(
            "store_operation_seconds", "Latency of state store operations.", store,
            buckets=_SECONDS_BUCKETS, **common)
        self.store_round_trips = prom.Counter(
            "store_round_trips", "Server round trips made by state store operations.",
            store, **common)
        restore = ["processor", "store", "partition"]
        self.restore_ratio = prom.Gauge(
            "restore_progress_ratio", "Changelog restore progress, 0 to 1.", restore, **common)
        self.restore_remaining = prom.Gauge(
            "restore_remaining_messages", "Changelog messages left to restore.", restore,
            **common)
        self.restores = prom.Counter(
            "restores", "Times a store partition was opened and brought level with its "
            "changelog (a partition kept through a rebalance is not).", restore, **common)
        self._add_standby_collectors(prom, common, restore)
        self.late_records = prom.Counter(
            "late_records", "Records a windowed table or join dropped because their window "
            "had closed (stream time past its end plus grace).", ["processor", "store"],
            **common)
        self.keys_expired = prom.Counter(
            "store_keys_expired", "Keys a table with a time to live (ttl=) removed as "
            "expired, each with a changelog tombstone.", ["processor", "store"], **common)
        self._stores_seen: set[str] = set()

    def _initialize(self) -> None:
        """Create the label sets known in advance, so a dashboard shows 0, not 'no data'."""
        self.produced.labels(self.processor)
        self.turns.labels(self.processor)
        for reason in ("decode", "process"):
            self.dead_letters.labels(self.processor, reason)
        for name in exceptions.__all__:
            if name != "KasperError":
                self.errors.labels(self.processor, name)
        for step in TIMED:
            self.step_seconds.labels(self.processor, step)
        for result in ("committed", "aborted"):
            self.transactions.labels(self.processor, result)
        for reason in ("missing", "wrong"):
            self.query_rejected.labels(self.processor, reason)
        self.transaction_seconds.labels(self.processor)
        for client in ("consumer", "producer"):
            for level in ("error", "warning"):
                self.client_logs.labels(self.processor, client, level)

    def observe_turn(self, stats: TurnStats, now: float) -> None:
        """Count one committed turn."""
        for (topic, partition), offsets in stats.batch.ranges.items():
            self.consumed.labels(self.processor, topic, str(partition)).inc(offsets.count)
        for letter in stats.dead_letters:
            self.count_dead_letter(letter)
        self.produced.labels(self.processor).inc(stats.produced)
        self.turns.labels(self.processor).inc()
        self.batch_size.labels(self.processor).observe(len(stats.batch))
        if stats.batch_size_target is not None:
            self.batch_target.labels(self.processor).set(stats.batch_size_target)
        for step, seconds in stats.durations.items():
            self.step_seconds.labels(self.processor, step).observe(seconds)
        self.last_turn.labels(self.processor).set(now)

    def count_dead_letter(self, letter: DeadLetter) -> None:
        """Count one record a committed turn set aside: skipped (undecodable), and
        produced to the dead-letter topic where its policy says so."""
        record = letter.record
        if letter.reason == "decode":
            self.skipped.labels(self.processor, record.topic, str(record.partition),
                                self.decode_policy, "decode").inc()
        self.errors.labels(self.processor, "SerdeError" if letter.reason == "decode"
                           else "ProcessingError").inc()
        if letter.reason in self.dead_letter_reasons:
            self.dead_letters.labels(self.processor, letter.reason).inc()

    def observe_store_op(self, store: str, op: str, seconds: float, round_trips: int) -> None:
        """Record one store operation."""
        self.store_seconds.labels(self.processor, store, op).observe(seconds)
        self.store_round_trips.labels(self.processor, store, op).inc(round_trips)
        self.saw_store(store)

    def saw_store(self, store: str) -> None:
        """Create the late-records series of a store the first time it reports, so the
        dashboard shows 0 late records rather than no data."""
        if store not in self._stores_seen:
            self._stores_seen.add(store)
            self.late_records.labels(self.processor, store)

    def _add_standby_collectors(self, prom: Any, common: dict[str, Any],
                                restore: list[str]) -> None:
        self.restored_records = prom.Counter(
            "restored_records", "Changelog records read by restores of a store "
            "partition.", restore, **common)
        self.last_restore_records = prom.Gauge(
            "last_restore_records", "Changelog records the last restore of a store "
            "partition read.", restore, **common)
        self.last_restore_seconds = prom.Gauge(
            "last_restore_seconds", "Seconds the last restore of a store partition took.",
            restore, **common)
        self.restore_from_standby = prom.Gauge(
            "last_restore_from_standby", "1 when the last restore of a store partition "
            "started from a standby's warm copy, else 0.", restore, **common)
        self.standby_offset = prom.Gauge(
            "standby_changelog_offset", "The next changelog offset a standby's warm copy "
            "reads (what it applied so far).", restore, **common)
        self.standby_lag = prom.Gauge(
            "standby_lag_records", "Changelog offsets a standby's warm copy is behind.",
            restore, **common)
        self.table_keys = prom.Gauge(
            "store_keys", "Keys of a local table's partition, as its backend estimates them "
            "(RocksDB's estimate-num-keys, after each applied turn).", restore, **common)
        self.standby_lag_seconds = prom.Gauge(
            "standby_lag_seconds", "Seconds since a standby's warm copy was last level "
            "with its changelog (0 when level).", restore, **common)

    def set_restore_done(self, store: str, partition: int, records: int, seconds: float,
                         from_standby: bool) -> None:
        """Record a finished restore of one store partition."""
        labels = (self.processor, store, str(partition))
        self.restored_records.labels(*labels).inc(records)
        self.last_restore_records.labels(*labels).set(records)
        self.last_restore_seconds.labels(*labels).set(seconds)
        self.restore_from_standby.labels(*labels).set(1 if from_standby else 0)

    def count_restore(self, store: str, partition: int) -> None:
        """Count one open of a store partition from its changelog."""
        self.restores.labels(self.processor, store, str(partition)).inc()

    def set_restore(self, store: str, partition: int, restored: int, total: int) -> None:
        """Set the restore gauges of one store partition."""
        labels = (self.processor, store, str(partition))
        self.restore_ratio.labels(*labels).set(restored / total if total > 0 else 1.0)
        self.restore_remaining.labels(*labels).set(max(total - restored, 0))


class AlignmentCollector:
    """The alignment of co-partitioned inputs (``Config.max_task_idle``), read from its
    report when scraped: the loop makes a new report each cut, so a scrape costs the
    loop nothing, and a wait with no turn (nothing released) still shows."""

    def __init__(self, processor: str, read: Callable[[], AlignmentReport]) -> None:
        self._processor, self._read = processor, read

    def describe(self) -> list[Metric]:
        """Nothing: collected on scrape only."""
        return []

    def collect(self) -> Iterable[Metric]:
        """Enforced processing and seconds waited per input, records held per input, and
        the topic-partitions whose fetch is held back."""
        from prometheus_client.core import (  # noqa: PLC0415 - optional extra
            CounterMetricFamily,
            GaugeMetricFamily,
        )

        report, processor = self._read(), self._processor
        tp = ["processor", "topic", "partition"]
        enforced = CounterMetricFamily(
            f"{NAMESPACE}_alignment_enforced", "Partitions processed past a caught-up input "
            "(topic, partition) with nothing read once max_task_idle was over.", labels=tp)
        waited = CounterMetricFamily(
            f"{NAMESPACE}_alignment_wait_seconds", "Seconds a partition number was held back "
            "waiting for an input (topic, partition) with nothing read, by reason: "
            "records_on_broker, lag_unknown, max_task_idle.", labels=[*tp, "reason"])
        held = GaugeMetricFamily(
            f"{NAMESPACE}_alignment_held_records", "Records read of an input (topic, "
            "partition) that the last batch held back for the next.", labels=tp)
        inputs = report.held.keys() | report.enforced.keys() | {k for k, _ in report.waited}
        for key in sorted(inputs):
            labels = [processor, key[0], str(key[1])]
            enforced.add_metric(labels, report.enforced.get(key, 0))
            if key in report.held:
                held.add_metric(labels, report.held[key])
        for (key, reason), seconds in sorted(report.waited.items()):
            waited.add_metric([processor, key[0], str(key[1]), reason], seconds)
        held_back = GaugeMetricFamily(
            f"{NAMESPACE}_alignment_held_back_partitions", "Input topic-partitions not "
            "fetched for now: a batch's worth of their records held back.",
            labels=["processor"])
        held_back.add_metric([processor], len(report.held_back))
        return [enforced, waited, held, held_back]
