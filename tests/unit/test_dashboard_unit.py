"""The Grafana dashboard covers every metric the library exports: the names come from
the code that registers them (tests/dashboard.py), not from a list kept by hand. That
each expression returns data is tests/integration/test_dashboard.py's job."""

from __future__ import annotations

from pathlib import Path

from tests.dashboard import dashboard_expressions, exported_metrics, series_of, series_read

OPERATIONS = Path(__file__).parents[2] / "docs" / "operations.md"


def test_every_exported_metric_is_on_a_panel() -> None:
    """Each metric family of the loop's PrometheusObserver, the stream runner's
    StreamMetrics and the supervisor's endpoint is read by at least one dashboard
    expression (a histogram through its _bucket, _sum or _count series)."""
    exported = exported_metrics()
    assert {"kasper_turns", "kasper_stream_batches",
            "kasper_supervisor_workers_running"} <= exported.keys()
    read = set().union(*map(series_read, dashboard_expressions()))
    missing = sorted(name for name, kind in exported.items() if not series_of(name, kind) & read)
    assert missing == [], f"metrics on no dashboard panel: {missing}"


def test_every_dashboard_series_is_exported() -> None:
    """No dashboard expression reads a series the library does not export (a renamed
    or misspelt metric would leave its panel empty)."""
    exported = set().union(*(series_of(n, k) for n, k in exported_metrics().items()))
    unknown = {expr: series_read(expr) - exported for expr in dashboard_expressions()}
    assert {expr: names for expr, names in unknown.items() if names} == {}


def test_every_exported_metric_is_documented() -> None:
    """docs/operations.md names each exported metric as Prometheus stores it."""
    text = OPERATIONS.read_text()
    undocumented = sorted(name for name, kind in exported_metrics().items()
                          if f"`{name}{'_total' if kind == 'counter' else ''}`" not in text)
    assert undocumented == [], f"metrics missing from docs/operations.md: {undocumented}"
