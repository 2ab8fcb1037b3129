"""What the dashboard tests share: the PromQL expressions of grafana/dashboards/kasper.json,
the metric names they read, and every metric the library exports, read from the code
that registers them (the loop's observer, running an app and aligned inputs, the stream
runner's, the supervisor's)."""

from __future__ import annotations

import dataclasses
import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kasper_py import Config
from kasper_py.kafka.alignment import AlignmentReport
from kasper_py.observability.metrics import PrometheusObserver
from kasper_py.stream._metrics import StreamMetrics
from kasper_py.supervisor import Supervisor, WorkerSpec

DASHBOARD = Path(__file__).parents[1] / "grafana" / "dashboards" / "kasper.json"
_SERIES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}


def expressions(node: Any) -> Iterator[str]:
    """Every ``expr`` string anywhere in the dashboard JSON."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            else:
                yield from expressions(value)
    elif isinstance(node, list):
        for item in node:
            yield from expressions(item)


def dashboard_expressions() -> list[str]:
    """The dashboard's distinct expressions, sorted."""
    return sorted(set(expressions(json.loads(DASHBOARD.read_text()))))


def series_read(expr: str) -> set[str]:
    """The ``kasper_*`` series names an expression reads."""
    return set(re.findall(r"\bkasper_[a-z0-9_]+", expr))


def series_of(name: str, kind: str) -> set[str]:
    """The series names Prometheus stores for a metric family of ``kind``: a counter
    ``x`` as ``x_total``, a histogram as ``x_bucket``, ``x_sum``, ``x_count``."""
    return {name + suffix for suffix in _SERIES[kind]}


def exported_metrics() -> dict[str, str]:
    """Every metric family the library exports, ``{name: type}`` (as the exposition
    parser names them: a counter without ``_total``); prometheus_client's ``x_created``
    series of a counter or histogram ``x`` are its bookkeeping, not a metric."""
    config = Config(name="dashboard", bootstrap_servers="127.0.0.1:1", input_topics=["in"])
    observer = PrometheusObserver(config, registry=CollectorRegistry())
    observer.watch_processors(lambda: {"split": (1, 0.5)})  # what an app adds
    observer.watch_alignment(lambda: AlignmentReport(  # what aligned inputs add
        {("t", 0): 1}, {(("t", 0), "max_task_idle"): 1.0}, {("u", 0): 2}, frozenset()))
    try:
        texts = [generate_latest(observer.registry).decode()]
    finally:
        observer.close()
    stream = StreamMetrics(dataclasses.replace(config, metrics_port=0))
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{stream.port}/metrics", timeout=10) as r:
            texts.append(r.read().decode())
    finally:
        stream.close()
    texts.append(Supervisor([WorkerSpec(0, ["true"])]).exposition().decode())
    families = {family.name: family.type
                for text in texts for family in text_string_to_metric_families(text)}
    return {name: kind for name, kind in families.items()
            if name.removesuffix("_created") not in families.keys() - {name}}
