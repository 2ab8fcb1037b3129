"""The Grafana dashboard, verified for real: the stack's Prometheus scrapes a running
`kasper run`, and every PromQL expression of grafana/dashboards/kasper.json must
return data through Prometheus's HTTP API, except those reading only series a plain
`kasper run` does not produce (``PARSED_ONLY``), which must parse there."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kasper_py import stack
from tests.dashboard import DASHBOARD, dashboard_expressions, series_read

sys.path.insert(0, str(Path(__file__).parent))
pytest.register_assert_rewrite("conftest_stores")
from conftest_stores import free_port, wait_for  # isort: skip  # noqa: E402 - after register_assert_rewrite

pytestmark = [pytest.mark.integration, pytest.mark.prometheus]

ROOT = Path(__file__).parents[2]
HERE = Path(__file__).parent
N = 25
PARSED_ONLY = re.compile(
    r"kasper_(stream|supervisor|app)_.*|kasper_messages_skipped_total|kasper_leader")
"""Series the test's `kasper run` does not produce: the Spark stream runner's (a
streaming query takes a Spark session, too slow for this suite), the supervisor's
(`--processes N`), an app's (``kasper_py.app``; tests/unit/test_app_unit.py reads them
from a loop running one), skipped messages (an undecodable input) and the lead (a
leader-only task). Their panels must parse."""


def query(base: str, expr: str) -> list[dict[str, Any]]:
    """The result vector of an instant query (an error status fails the test)."""
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.load(response)
    except urllib.error.HTTPError as error:
        body = json.load(error)
    assert body["status"] == "success", (expr, body)
    return list(body["data"]["result"])


def render(expr: str, processor: str) -> str:
    """Replace Grafana's variables as Grafana would for one selected processor."""
    expr = re.sub(r"\$\{?processor\}?", processor, expr)  # names need no regex escaping
    return expr.replace("$__rate_interval", "1m")






@pytest.fixture(scope="module")
def prometheus() -> str:
    """Base URL of the stack's Prometheus, started if it is not running."""
    base = stack.prometheus_url()
    try:
        urllib.request.urlopen(f"{base}/-/ready", timeout=5).close()
    except OSError:
        stack.up(["prometheus"])
    return base


@pytest.fixture
def scraped_processor(bootstrap: str, new_topic: Callable[..., str], kafka: Any,
                      unique_name: Callable[[str], str],
                      tmp_path: Path) -> Iterator[str]:
    """A `kasper run` that has processed N messages and is scraped by Prometheus;
    yields its processor name."""
    source, sink = new_topic("dash-in", partitions=2), new_topic("dash-out", partitions=2)
    name, port = unique_name("dash"), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KASPER_")}
    env.update(KASPER_BOOTSTRAP_SERVERS=bootstrap, KASPER_NAME=name,
               KASPER_INPUT_TOPICS=source, KASPER_METRICS_PORT=str(port),
               KASPER_BATCH_SIZE="5", KASPER_BATCH_WAIT="0.5", EXAMPLE_OUTPUT_TOPIC=sink)
    log = (tmp_path / "stderr.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "kasper_py", "run", "examples_module:factory", "--stores",
         "examples_module:stores", "--app-dir", str(HERE), "--metrics-host", "127.0.0.1"],
        env=env, stderr=log)
    stack.set_prometheus_targets([f"127.0.0.1:{port}"])
    try:
        kafka.produce(source, [(f"k{i}".encode(), f"v{i}".encode()) for i in range(N)])
        yield name
    finally:
        stack.set_prometheus_targets([])
        process.terminate()
        process.wait(60)
        log.close()


def test_every_dashboard_expression_returns_data(prometheus: str,
                                                 scraped_processor: str) -> None:
    """Once Prometheus has scraped the processor's N messages, each PromQL expression
    in the dashboard (with $processor set to it) returns at least one series; one that
    reads only ``PARSED_ONLY`` series is accepted by Prometheus's query API (a query
    that finds no data succeeds, a syntax error does not). The processor variable's
    label_values query finds the processor."""
    name = scraped_processor
    consumed = f'sum(kasper_messages_consumed_total{{processor="{name}"}})'
    wait_for(lambda: [float(r["value"][1]) for r in query(prometheus, consumed)] == [N],
             f"Prometheus to scrape {N} consumed messages of {name}")
    exprs = dashboard_expressions()
    parsed_only = [e for e in exprs if all(PARSED_ONLY.fullmatch(s) for s in series_read(e))]
    assert len(exprs) - len(parsed_only) >= 10 and len(parsed_only) >= 7
    for expr in parsed_only:
        query(prometheus, render(expr, name))
    for expr in sorted(set(exprs) - set(parsed_only)):
        rendered = render(expr, name)
        wait_for(lambda rendered=rendered: bool(query(prometheus, rendered)),
                 f"data for {rendered}", timeout=30)
    series = query(prometheus, f'count by (processor) (kasper_turns_total{{processor="{name}"}})')
    assert [s["metric"]["processor"] for s in series] == [name]


def test_provisioning_points_at_the_dashboard_folder() -> None:
    """The dashboard provider loads grafana/dashboards, the datasource is Prometheus, and
    every panel uses the dashboard's datasource variable."""
    grafana = ROOT / "grafana"
    provider = (grafana / "provisioning" / "dashboards" / "kasper.yml").read_text()
    datasource = (grafana / "provisioning" / "datasources" / "kasper-prometheus.yml").read_text()
    assert "path: ${KASPER_GRAFANA_DIR}/dashboards" in provider
    assert "type: prometheus" in datasource
    dashboard = json.loads(DASHBOARD.read_text())
    names = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "processor"} <= names
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
