"""The HTTP servers a loop owns (``kasper_py.loop.servers``): the metrics of the observer
it builds itself, the tables and views on a query server of their own, each closed by
the loop; an observer passed in is neither served nor closed by it. Loopback only."""

from __future__ import annotations

import dataclasses
import json
import threading
import urllib.error
import urllib.request
from typing import Any

import pytest

from kasper_py import Config
from kasper_py.loop.servers import LoopServers
from kasper_py.observability.metrics import PrometheusObserver
from kasper_py.observability.observe import NoopObserver

CONFIG = Config(name="served", bootstrap_servers="in-memory", input_topics=["in"])


def get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def close(steps: list[Any]) -> None:
    for step in steps:
        step()


def test_without_an_observer_the_loop_serves_and_closes_its_own_metrics() -> None:
    servers = LoopServers(dataclasses.replace(CONFIG, metrics_port=0), None)
    assert isinstance(servers.observer, PrometheusObserver)
    assert servers.metrics is not None
    base = f"http://127.0.0.1:{servers.metrics.port}"
    try:
        status, body = get(f"{base}/metrics")
        assert status == 200 and b"kasper_" in body
        assert get(f"{base}/health/ready")[0] == 503  # not started yet
        status, error = get(f"{base}/tables")
        assert status == 404 and "try /metrics, /health/live, /health/ready" in error["message"]
    finally:
        close(servers.closing_metrics())
    with pytest.raises(urllib.error.URLError):
        get(f"{base}/metrics")


def test_an_observer_passed_in_is_neither_served_nor_closed_by_the_loop() -> None:
    observer = PrometheusObserver(CONFIG)
    servers = LoopServers(dataclasses.replace(CONFIG, metrics_port=0), observer)
    assert servers.observer is observer and servers.metrics is None
    assert servers.closing_metrics() == []
    observer.close()


def test_without_metrics_port_nothing_is_served() -> None:
    servers = LoopServers(CONFIG, None)
    assert isinstance(servers.observer, NoopObserver) and servers.metrics is None


def test_without_query_port_the_tables_are_not_served_and_views_are_refused() -> None:
    servers = LoopServers(CONFIG, None)
    tables = servers.serve_tables([], {}, {}, locate=False)
    assert tables.describe() == [] and servers.endpoint is None
    assert servers.closing_queries() == []
    with pytest.raises(ValueError, match="views are served on the query server"):
        servers.serve_tables([], {}, {"/v": lambda _r, _t: {}}, locate=False)


def test_tables_and_views_have_a_loopback_server_of_their_own() -> None:
    config = dataclasses.replace(CONFIG, metrics_port=0, query_port=0)
    servers = LoopServers(config, None)
    servers.serve_tables([], {}, {"/hello": lambda _request, _tables: {"hi": 1}},
                         locate=False)
    assert servers.queries is not None and servers.metrics is not None
    try:
        assert servers.queries.host == "127.0.0.1"
        assert servers.endpoint == f"http://127.0.0.1:{servers.queries.port}"
        assert get(f"{servers.endpoint}/tables") == (200, b'{"processor":"served","tables":[]}')
        assert get(f"{servers.endpoint}/hello") == (200, b'{"hi":1}')
        metrics = f"http://127.0.0.1:{servers.metrics.port}"
        assert get(f"{metrics}/hello")[0] == 404
    finally:
        close(servers.closing_queries() + servers.closing_metrics())
    with pytest.raises(urllib.error.URLError):
        get(f"{servers.endpoint}/tables")


def test_a_view_path_refused_releases_the_query_server() -> None:
    servers = LoopServers(dataclasses.replace(CONFIG, query_port=0), None)
    with pytest.raises(ValueError, match="taken by kasper_py's own /metrics"):
        servers.serve_tables([], {}, {"/metrics": lambda _r, _t: {}}, locate=False)
    assert servers.queries is None
    assert not [t for t in threading.enumerate() if t.name == "kasper-queries"]
