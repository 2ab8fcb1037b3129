"""The driver's metrics of a streaming query, ``kasper_stream_*``, from its micro-batches
and Spark's progress events, served on ``/metrics`` beside the loop's collectors when
``Config.metrics_port`` is set. prometheus-client is imported only when it is.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kasper_py.config import Config

if TYPE_CHECKING:
    from kasper_py.observability.metrics import PrometheusObserver

__all__ = ["StreamMetrics", "source_lag"]

# Micro-batch durations, seconds: from a quick local batch to a slow cluster one.
_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class StreamMetrics:
    """Counts micro-batches and rows; a no-op without ``Config.metrics_port``."""

    def __init__(self, config: Config) -> None:
        self._observer: PrometheusObserver | None = None
        self._metrics: dict[str, Any] = {}
        if config.metrics_port is None:
            return
        from kasper_py.observability.metrics import PrometheusObserver  # noqa: PLC0415 - optional extra

        self._observer = PrometheusObserver(config)
        self._observer.on_start([])  # /health/ready: the query is started
        self._metrics = _collectors(self._observer, config.name)
        self._observer.serve(config.metrics_port, config.metrics_host)

    @property
    def port(self) -> int | None:
        """The port ``/metrics`` is served on, if any."""
        server = self._observer.server if self._observer is not None else None
        return None if server is None else server.port

    def observe_batch(self, messages: int, produced: int, seconds: float) -> None:
        """A micro-batch completed: its input rows, output and wall time."""
        if self._observer is None:
            return
        self._metrics["batches"].inc()
        self._metrics["input"].inc(messages)
        self._metrics["produced"].inc(produced)
        self._metrics["duration"].observe(seconds)
        self._observer.on_idle()  # /health/live: the query makes progress

    def observe_progress(self, progress: Mapping[str, Any]) -> int:
        """A progress event (``StreamingQuery.recentProgress``); returns the lag in
        messages it reports."""
        lag = sum(source_lag(source) for source in progress.get("sources") or [])
        if self._observer is not None:
            self._metrics["batch_rows"].set(progress.get("numInputRows") or 0)
            self._metrics["rate"].set(progress.get("processedRowsPerSecond") or 0.0)
            self._metrics["lag"].set(lag)
            self._observer.on_idle()
        return lag

    def close(self) -> None:
        """Stop serving."""
        if self._observer is not None:
            self._observer.on_stop()
            self._observer.close()
            self._observer = None


def source_lag(source: Mapping[str, Any]) -> int:
    """Messages between a Kafka source's end offsets and its latest offsets."""
    ends, latest = _offsets(source.get("endOffset")), _offsets(source.get("latestOffset"))
    return sum(max(int(latest[topic][partition]) - int(offset), 0)
               for topic, partitions in ends.items() for partition, offset in partitions.items()
               if partition in latest.get(topic, {}))


def _offsets(value: Any) -> dict[str, dict[str, Any]]:
    """A source's offsets, ``{topic: {partition: offset}}``: Spark's JSON text, or as
    PySpark 4's ``SourceProgress`` gives it, ``str()`` of the parsed dict."""
    if isinstance(value, str):
        text = value.strip()
        try:
            value = json.loads(text)
        except ValueError:
            try:
                value = ast.literal_eval(text) if text.startswith("{") else None
            except (ValueError, SyntaxError):
                value = None
    return value if isinstance(value, dict) else {}


def _collectors(observer: PrometheusObserver, processor: str) -> dict[str, Any]:
    from prometheus_client import Counter, Gauge, Histogram  # noqa: PLC0415 - optional extra

    registry, labels = observer.registry, ["processor"]

    def made(kind: Any, name: str, text: str, **extra: Any) -> Any:
        return kind(name, text, labels, registry=registry, **extra).labels(processor)

    return {
        "batches": made(Counter, "kasper_stream_batches", "Micro-batches completed"),
        "input": made(Counter, "kasper_stream_input_rows", "Input records processed"),
        "produced": made(Counter, "kasper_stream_produced", "Output messages produced"),
        "duration": made(Histogram, "kasper_stream_batch_duration_seconds",
                         "Wall time of a micro-batch's tasks and commit", buckets=_BUCKETS),
        "batch_rows": made(Gauge, "kasper_stream_batch_input_rows",
                           "Input rows of the last micro-batch (Spark's progress)"),
        "rate": made(Gauge, "kasper_stream_processed_rows_per_second",
                     "Rows per second of the last micro-batch (Spark's progress)"),
        "lag": made(Gauge, "kasper_stream_lag_messages",
                    "Messages after the last micro-batch's end offsets (Spark's progress)"),
    }
