"""Prometheus metrics and health endpoints of a TopicProcessor.

``PrometheusObserver`` implements ``LoopObserver`` and, for the stores the loop opens,
``StoreObserver``: it keeps its collectors (``collectors.py``) in its own
``CollectorRegistry``, adds the lag gauges computed when scraped, and serves
``/metrics``, ``/health/live`` and ``/health/ready``. prometheus_client is imported
here and in ``collectors.py`` only, and only when an observer is built; with metrics
off the loop and its stores report to the no-ops of ``observe.py``, and the clients'
log count (``count_client_log``) costs nothing.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kasper_py.kafka.client_log import count_lines_with
from kasper_py.message import TopicPartitionKey
from kasper_py.observability.collectors import AlignmentCollector, Collectors
from kasper_py.observability.http import Handler, HttpServer, Request, Response
from kasper_py.observability.observe import (
    LoopObserver,
    NoopObserver,
    StoreObserver,
    TurnStats,
)

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

    from kasper_py.config import Config
    from kasper_py.kafka.alignment import AlignmentReport

__all__ = ["METRICS_PATHS", "MetricsServer", "PrometheusObserver", "count_client_log",
           "metrics_app", "observer_for"]

_LIVE_FLOOR = 30.0  # seconds: a slow turn (a big batch, a slow store) must not look dead


# -- the clients' log count ----------------------------------------------------------
# librdkafka's log callback is set when a client is built, before any observer is at
# hand, so its lines are counted through this registry of live observers by name,
# handed to the clients' log (``kafka.client_log``) when the first observer registers.

_observers: dict[str, weakref.WeakSet[PrometheusObserver]] = {}
_registry_lock = threading.Lock()


def count_client_log(processor: str, client: str, level: str) -> None:
    """Count one log line of a Kafka client (``consumer``, ``producer``, ``admin``) of
    ``processor``, at the ``level`` it is logged at, held-back repeats included."""
    for observer in _observers_of(processor):
        observer.collectors.client_logs.labels(processor, client, level).inc()


def _observers_of(processor: str) -> list[PrometheusObserver]:
    with _registry_lock:
        return list(_observers.get(processor, ()))


def _register(observer: PrometheusObserver) -> None:
    count_lines_with(count_client_log)
    with _registry_lock:
        _observers.setdefault(observer.processor, weakref.WeakSet()).add(observer)


def _unregister(observer: PrometheusObserver) -> None:
    with _registry_lock:
        _observers.get(observer.processor, weakref.WeakSet()).discard(observer)


@dataclass
class _PartitionState:
    """What the observer knows of one input (topic, partition)."""

    committed: int | None = None
    high_watermark: int | None = None
    last_timestamp_ms: int | None = None


class _ProgressCollector:
    """Lag gauges computed when scraped, so time-based lag keeps growing between turns."""

    def __init__(self, observer: PrometheusObserver) -> None:
        self._observer = observer

    def describe(self) -> list[Metric]:
        """Nothing: the names are only known when collected (skips registry checks)."""
        return []

    def collect(self) -> Iterable[Metric]:
        """Lag in messages and seconds, per input (topic, partition), and readiness."""
        from prometheus_client.core import GaugeMetricFamily  # noqa: PLC0415 - optional extra

        tp = ["processor", "topic", "partition"]
        families = {
            "lag": GaugeMetricFamily(
                "kasper_consumer_lag_messages",
                "High watermark minus committed offset.", labels=tp),
            "timestamp": GaugeMetricFamily(
                "kasper_last_processed_timestamp_seconds",
                "Timestamp of the last processed message.", labels=tp),
            "lag_seconds": GaugeMetricFamily(
                "kasper_lag_seconds",
                "Now minus the timestamp of the last processed message.", labels=tp),
            "oldest": GaugeMetricFamily(
                "kasper_oldest_unprocessed_age_seconds",
                "Age of the oldest unprocessed message (0 when caught up).", labels=tp),
        }
        self._fill(families, self._observer.clock())
        ready = GaugeMetricFamily("kasper_ready", "1 when partitions are assigned and "
                                  "tables restored.", labels=["processor"])
        ready.add_metric([self._observer.processor], 1.0 if self._observer.ready else 0.0)
        return [*families.values(), ready]

    def _fill(self, families: dict[str, Any], now: float) -> None:
        for (topic, partition), state in self._observer.partition_states().items():
            labels = [self._observer.processor, topic, str(partition)]
            lag = None
            if state.committed is not None and state.high_watermark is not None:
                lag = max(state.high_watermark - state.committed, 0)
                families["lag"].add_metric(labels, lag)
            if state.last_timestamp_ms is None:
                if lag == 0:
                    families["oldest"].add_metric(labels, 0.0)
                continue
            seconds = state.last_timestamp_ms / 1000
            behind = max(now - seconds, 0.0)
            families["timestamp"].add_metric(labels, seconds)
            families["lag_seconds"].add_metric(labels, behind)
            if lag is not None:
                # The next unprocessed message was written at or after the last processed
                # one, so its age is at most ``behind``; exact while the topic is steady.
                families["oldest"].add_metric(labels, behind if lag > 0 else 0.0)


class _AppCollector:
    """An app's per-processor counters, read from the app when scraped."""

    def __init__(self, processor: str,
                 read: Callable[[], Mapping[str, tuple[int, float]]]) -> None:
        self._processor, self._read = processor, read

    def describe(self) -> list[Metric]:
        """Nothing: collected on scrape only."""
        return []

    def collect(self) -> Iterable[Metric]:
        """Messages and seconds per processor of the app (label ``app_processor``)."""
        from prometheus_client.core import CounterMetricFamily  # noqa: PLC0415 - optional

        labels = ["processor", "app_processor"]
        messages = CounterMetricFamily(
            "kasper_app_processor_messages", "Messages handed to a processor of the app.",
            labels=labels)
        seconds = CounterMetricFamily(
            "kasper_app_processor_seconds", "Seconds a processor of the app spent in "
            "process().", labels=labels)
        for name, (count, spent) in sorted(self._read().items()):
            messages.add_metric([self._processor, name], count)
            seconds.add_metric([self._processor, name], spent)
        return [messages, seconds]


# -- health ---------------------------------------------------------------------------

@dataclass(frozen=True)
class HealthReport:
    """One answer of a health endpoint."""

    ok: bool
    detail: dict[str, Any]

    def body(self) -> bytes:
        """The JSON body served with 200 (ok) or 503."""
        return json.dumps({"status": "ok" if self.ok else "fail", **self.detail}).encode()


# -- the observer ---------------------------------------------------------------------

class PrometheusObserver(LoopObserver, StoreObserver):
    """Metrics and health of one TopicProcessor, and of the stores it opens; pass it
    as ``observer=``.

    Liveness: the loop started, turned, idled or reported restore progress within
    ``live_timeout`` seconds (default ``max(5 * batch_wait, 30)``) and has not stopped.
    Readiness: partitions are assigned and tables restored (``on_start``), not stopped.
    """

    def __init__(self, config: Config, *, registry: CollectorRegistry | None = None,
                 live_timeout: float | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.processor = config.name
        self.collectors = Collectors(config.name, registry, config.on_decode_error,
                                      config.processing_guarantee)
        self.clock = clock
        self.live_timeout = live_timeout or max(5 * config.batch_wait, _LIVE_FLOOR)
        self._lock = threading.Lock()
        self._partitions: dict[TopicPartitionKey, _PartitionState] = {}
        self._last_activity = clock()
        self._assigned = 0
        self._started = False
        self._stopped = False
        self._error: str | None = None
        self._server: MetricsServer | None = None
        self.registry.register(_ProgressCollector(self))
        _register(self)

    @property
    def registry(self) -> CollectorRegistry:
        """The registry holding this observer's collectors (one per observer)."""
        return self.collectors.registry

    @property
    def server(self) -> MetricsServer | None:
        """The HTTP server started by ``serve()``, if any."""
        return self._server

    @property
    def ready(self) -> bool:
        """Partitions assigned, tables restored, and not stopped."""
        return self._started and not self._stopped

    # -- LoopObserver ---------------------------------------------------------

    def on_start(self, assigned: list[TopicPartitionKey]) -> None:
        """Partitions are assigned and tables restored: ready."""
        with self._lock:
            for tp in assigned:
                self._partitions.setdefault(tp, _PartitionState())
            self._assigned = len(assigned)
            self._started = True
            self._last_activity = self.clock()

    def on_turn(self, stats: TurnStats) -> None:
        """Count the turn and update what is known of each partition's progress."""
        now = self.clock()
        self.collectors.observe_turn(stats, now)
        with self._lock:
            self._last_activity = now
            for tp, offsets in stats.batch.ranges.items():
                state = self._partitions.setdefault(tp, _PartitionState())
                if offsets.last_timestamp is not None:
                    state.last_timestamp_ms = offsets.last_timestamp
            for tp, offset in stats.committed.items():
                self._partitions.setdefault(tp, _PartitionState()).committed = offset
            for tp, high in stats.high_watermarks.items():
                self._partitions.setdefault(tp, _PartitionState()).high_watermark = high

    def on_idle(self) -> None:
        """A poll came back empty: the loop is alive."""
        with self._lock:
            self._last_activity = self.clock()

    def on_transaction(self, result: str, seconds: float) -> None:
        """Count an exactly-once transaction; time a committed one."""
        self.collectors.transactions.labels(self.processor, result).inc()
        if result == "committed":
            self.collectors.transaction_seconds.labels(self.processor).observe(seconds)

    def on_error(self, error: BaseException) -> None:
        """Count the error by type; the loop is stopping."""
        self.collectors.errors.labels(self.processor, type(error).__name__).inc()
        with self._lock:
            self._error = f"{type(error).__name__}: {error}"

    def on_stop(self) -> None:
        """The loop stopped: neither live nor ready from now on."""
        with self._lock:
            self._stopped = True

    def watch_processors(self, read: Callable[[], Mapping[str, tuple[int, float]]]) -> None:
        """Export the app's per-processor counters (``kasper_app_processor_*``)."""
        self.registry.register(_AppCollector(self.processor, read))

    def watch_alignment(self, read: Callable[[], AlignmentReport]) -> None:
        """Export the alignment of the inputs (``kasper_alignment_*``)."""
        self.registry.register(AlignmentCollector(self.processor, read))

    def on_query_rejected(self, reason: str) -> None:
        """Count a query request refused with 401 (``missing`` or ``wrong`` token)."""
        self.collectors.query_rejected.labels(self.processor, reason).inc()

    def on_leader(self, leading: bool) -> None:
        """Set ``kasper_leader``: 1 while this process leads its app's processes."""
        self.collectors.leader.labels(self.processor).set(1 if leading else 0)

    def store_observer(self) -> StoreObserver:
        """This observer: the loop's stores report to its collectors."""
        return self

    # -- StoreObserver --------------------------------------------------------

    def on_store_op(self, store: str, op: str, seconds: float, round_trips: int) -> None:
        """Record one store operation: its latency and round trips."""
        self.collectors.observe_store_op(store, op, seconds, round_trips)

    def on_restore_started(self, store: str, partition: int, records: int) -> None:
        """A store partition is opened from its changelog: count it."""
        self.collectors.count_restore(store, partition)

    def on_restore_progress(self, store: str, partition: int, restored: int, total: int) -> None:
        """A restore made progress: set its gauges; restoring counts as alive."""
        self.collectors.set_restore(store, partition, restored, total)
        self.collectors.saw_store(store)
        with self._lock:
            self._last_activity = self.clock()

    def on_late_records(self, store: str, count: int) -> None:
        """Count records a window of ``store`` dropped as late."""
        self.collectors.late_records.labels(self.processor, store).inc(count)

    def on_records_skipped(self, store: str, partition: int, reason: str, count: int) -> None:
        """Count records the operator of ``store`` skipped: in ``messages_skipped`` with
        no input topic (the record was made inside the stage) and policy ``skip``."""
        self.collectors.skipped.labels(self.processor, "", str(partition), "skip",
                                       reason).inc(count)

    def on_keys_expired(self, store: str, count: int) -> None:
        """Count keys ``store`` removed as expired (its ``ttl``)."""
        self.collectors.keys_expired.labels(self.processor, store).inc(count)

    def on_table_size(self, store: str, partition: int, keys: int) -> None:
        """Set the key count ``store``'s ``partition`` reports."""
        self.collectors.table_keys.labels(self.processor, store, str(partition)).set(keys)

    def on_restore_done(self, store: str, partition: int, records: int, seconds: float,
                        from_standby: bool) -> None:
        """Set the last restore's records, seconds and origin; count its records."""
        self.collectors.set_restore_done(store, partition, records, seconds, from_standby)

    def on_standby_lag(self, store: str, partition: int, offset: int, records: int,
                       seconds: float) -> None:
        """Set the standby lag gauges of one warm partition."""
        labels = (self.processor, store, str(partition))
        self.collectors.standby_offset.labels(*labels).set(offset)
        self.collectors.standby_lag.labels(*labels).set(records)
        self.collectors.standby_lag_seconds.labels(*labels).set(seconds)

    def on_standby_stopped(self, store: str, partition: int) -> None:
        """Remove the standby gauges of a partition no longer kept warm here."""
        labels = (self.processor, store, str(partition))
        for gauge in (self.collectors.standby_offset, self.collectors.standby_lag,
                      self.collectors.standby_lag_seconds):
            with contextlib.suppress(KeyError):  # never reported
                gauge.remove(*labels)

    # -- health ---------------------------------------------------------------

    def liveness(self) -> HealthReport:
        """Live while the loop turns (or idles, or restores) within ``live_timeout``."""
        with self._lock:
            quiet = self.clock() - self._last_activity
            ok = not self._stopped and self._error is None and quiet <= self.live_timeout
            detail: dict[str, Any] = {
                "processor": self.processor, "seconds_since_last_turn": round(quiet, 3),
                "live_timeout": self.live_timeout, "stopped": self._stopped}
            if self._error:
                detail["error"] = self._error
        return HealthReport(ok, detail)

    def readiness(self) -> HealthReport:
        """Ready once partitions are assigned and tables restored, until stopped."""
        with self._lock:
            detail = {"processor": self.processor, "assigned_partitions": self._assigned,
                      "started": self._started, "stopped": self._stopped}
            return HealthReport(self._started and not self._stopped, detail)

    def partition_states(self) -> dict[TopicPartitionKey, _PartitionState]:
        """A copy of what is known per input (topic, partition)."""
        with self._lock:
            return {tp: _PartitionState(s.committed, s.high_watermark, s.last_timestamp_ms)
                    for tp, s in self._partitions.items()}

    # -- exporter -------------------------------------------------------------

    def serve(self, port: int, host: str = "0.0.0.0") -> MetricsServer:
        """Serve ``/metrics`` and ``/health/*`` on ``port`` (0: any free port)."""
        if self._server is None:
            self._server = MetricsServer(self, host, port)
        return self._server

    def close(self) -> None:
        """Stop serving and stop counting client log lines."""
        _unregister(self)
        if self._server is not None:
            self._server.close()
            self._server = None


METRICS_PATHS = ("/metrics", "/health/live", "/health/ready")
"""What ``metrics_app`` answers."""


class MetricsServer(HttpServer):
    """A background HTTP server: ``/metrics``, ``/health/live`` and ``/health/ready``.
    The tables and views are not served here but on their own server
    (``Config.query_port``, loopback by default): metrics are public by convention,
    the application's state is not."""

    def __init__(self, observer: PrometheusObserver, host: str, port: int) -> None:
        super().__init__(host, port, name="metrics", apps=[metrics_app(observer)],
                         paths=METRICS_PATHS)


def metrics_app(observer: PrometheusObserver) -> Handler:
    """``observer``'s ``/metrics`` and ``/health/{live,ready}``, to mount on a server."""
    from prometheus_client import (  # noqa: PLC0415 - optional extra
        CONTENT_TYPE_LATEST,
        generate_latest,
    )

    def answer(request: Request) -> Response | None:
        if request.path == "/metrics":
            return Response(generate_latest(observer.registry), content_type=CONTENT_TYPE_LATEST)
        if request.path in ("/health/live", "/health/ready"):
            live = request.path.endswith("live")
            report = observer.liveness() if live else observer.readiness()
            return Response(report.body(), 200 if report.ok else 503, "application/json")
        return None

    return answer


def observer_for(config: Config, host: str | None = None) -> LoopObserver:
    """A serving ``PrometheusObserver`` when ``config.metrics_port`` is set (on ``host``,
    else ``config.metrics_host``), else a no-op."""
    if config.metrics_port is None:
        return NoopObserver()
    observer = PrometheusObserver(config)
    try:
        observer.serve(config.metrics_port, host or config.metrics_host)
    except BaseException:
        observer.close()
        raise
    return observer
