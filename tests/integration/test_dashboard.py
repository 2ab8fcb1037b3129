"""The Grafana dashboard, verified for real: the stack's Prometheus scrapes a running
`kasper run`, and every PromQL expression of grafana/dashboards/kasper.json must
return data through Prometheus's HTTP API, except those reading only series a plain
`kasper run` does not produce (``PARSED_ONLY``), which must parse there."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kasper_py import stack
from kasper_py.stack._settings import Settings
from tests.dashboard import DASHBOARD, dashboard_expressions, series_read
from tests.on_demand import on_demand

sys.path.insert(0, str(Path(__file__).parent))
pytest.register_assert_rewrite("conftest_stores")
from conftest_stores import free_port, wait_for  # isort: skip  # noqa: E402 - after register_assert_rewrite

pytestmark = [pytest.mark.integration, pytest.mark.prometheus]

ROOT = Path(__file__).parents[2]
HERE = Path(__file__).parent
N = 25
PARSED_ONLY = re.compile(
    r"kasper_(stream|supervisor|app|standby|alignment)_.*|kasper_messages_skipped_total"
    r"|kasper_leader|kasper_store_keys_expired_total|kasper_store_keys")
"""Series the test's `kasper run` does not produce: the Spark stream runner's (a
streaming query takes a Spark session, too slow for this suite), the supervisor's
(`--processes N`), an app's (``kasper_py.app``; tests/unit/test_app_unit.py reads them
from a loop running one), aligned inputs' (two input topics;
tests/integration/test_alignment_cli.py reads them), skipped messages (an undecodable
input), the lead (a leader-only task) and standbys' (a second process keeping partitions warm;
tests/integration/test_standby.py reads them) and expired keys and keys per table partition
(a table with a ttl; a RocksDB table: tests/integration/test_standby.py reads the
latter; this processor has neither). Their panels must parse."""


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


@dataclass(frozen=True)
class Scraped:
    """A running `kasper run` that Prometheus scrapes."""

    name: str
    address: str
    process: subprocess.Popen[bytes]


def active_targets(base: str) -> list[dict[str, Any]]:
    """Prometheus's active scrape targets (``/api/v1/targets``)."""
    with urllib.request.urlopen(f"{base}/api/v1/targets?state=active", timeout=10) as reply:
        body = json.load(reply)
    assert body["status"] == "success", body
    return list(body["data"]["activeTargets"])


def target_health(base: str, address: str) -> str | None:
    """``up``, ``down`` or ``unknown`` for the target scraping ``address``; None if absent."""
    found = [t["health"] for t in active_targets(base) if t["labels"]["instance"] == address]
    return found[0] if found else None


@pytest.fixture(scope="module")
def prometheus() -> str:
    """Base URL of the stack's Prometheus, started if it is not running."""
    base = stack.prometheus_url()
    on_demand("prometheus", base,
              lambda: urllib.request.urlopen(f"{base}/-/ready", timeout=5).close(),
              external=False)
    return base


@pytest.fixture
def scraped_processor(bootstrap: str, new_topic: Callable[..., str], kafka: Any,  # noqa: PLR0917
                      unique_name: Callable[[str], str], prometheus: str,
                      tmp_path: Path) -> Iterator[Scraped]:
    """A `kasper run` that has processed N messages, found and scraped by the stack's
    Prometheus through the target file it registers itself (file-based discovery, no
    hand-set target)."""
    source, sink = new_topic("dash-in", partitions=2), new_topic("dash-out", partitions=2)
    name, port = unique_name("dash"), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KASPER_")}
    env.update(KASPER_BOOTSTRAP_SERVERS=bootstrap, KASPER_NAME=name,
               KASPER_INPUT_TOPICS=source, KASPER_METRICS_PORT=str(port),
               KASPER_BATCH_SIZE="5", KASPER_BATCH_WAIT="0.5", EXAMPLE_OUTPUT_TOPIC=sink,
               KASPER_STACK_DIR=str(Settings.load().stack_dir))
    log = (tmp_path / "stderr.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "kasper_py", "run", "examples_module:factory", "--stores",
         "examples_module:stores", "--app-dir", str(HERE), "--metrics-host", "127.0.0.1"],
        env=env, stderr=log, cwd=tmp_path)
    address = f"127.0.0.1:{port}"
    try:
        wait_for(lambda: target_health(prometheus, address) == "up",
                 f"Prometheus to discover and scrape {address}", timeout=60)
        kafka.produce(source, [(f"k{i}".encode(), f"v{i}".encode()) for i in range(N)])
        yield Scraped(name, address, process)
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(60)
        log.close()


def test_a_processor_is_a_target_while_it_runs(prometheus: str,
                                               scraped_processor: Scraped) -> None:
    """`kasper run` registers one target file naming itself while it runs (Prometheus
    scrapes it: the fixture waited for that); once it has exited the file is gone and
    Prometheus drops the target (its discovery re-reads the folder every second)."""
    targets = Settings.load().stack_dir / "prometheus" / "targets"
    mine = f"{scraped_processor.process.pid}-{scraped_processor.name}.json"
    assert mine in [path.name for path in targets.glob("*.json")]
    scraped_processor.process.terminate()
    assert scraped_processor.process.wait(60) == 0
    assert not (targets / mine).exists()
    wait_for(lambda: target_health(prometheus, scraped_processor.address) is None,
             f"Prometheus to drop {scraped_processor.address}", timeout=90)


def loaded_config(base: str) -> str:
    """The configuration Prometheus runs with (``/api/v1/status/config``)."""
    with urllib.request.urlopen(f"{base}/api/v1/status/config", timeout=10) as reply:
        return str(json.load(reply)["data"]["yaml"])


def test_up_reloads_a_prometheus_running_an_older_config(prometheus: str) -> None:
    """A Prometheus left running with a configuration from before the processors'
    targets folder (a stack started by an older version) learns it from `kasper stack
    up prometheus`: the file is rewritten and Prometheus reloads it, same pid."""
    stack_dir = Settings.load().stack_dir
    config = stack_dir / "prometheus" / "prometheus.yml"
    glob = f"{stack_dir / 'prometheus' / 'targets'}/*.json"
    (pid,) = [s.pid for s in stack.status() if s.name == "prometheus"]
    assert pid is not None
    current = config.read_text()
    config.write_text("".join(line for line in current.splitlines(keepends=True)
                              if glob not in line))
    try:
        os.kill(pid, signal.SIGHUP)
        wait_for(lambda: glob not in loaded_config(prometheus), "the older config to load")
        result = subprocess.run(
            [sys.executable, "-m", "kasper_py", "stack", "up", "prometheus"],
            capture_output=True, text=True, check=False,
            env={**os.environ, "KASPER_STACK_DIR": str(stack_dir)})
        wait_for(lambda: glob in loaded_config(prometheus), "the reloaded config", timeout=30)
    finally:  # whatever happened, the stack's Prometheus runs this version's config
        config.write_text(current)
        os.kill(pid, signal.SIGHUP)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        f"prometheus: already running (pid {pid}) at 127.0.0.1:{Settings.load().prometheus_port}"
        "\nprometheus: configuration changed, reloaded\n")


def test_every_dashboard_expression_returns_data(prometheus: str,
                                                 scraped_processor: Scraped) -> None:
    """Once Prometheus has scraped the processor's N messages, each PromQL expression
    in the dashboard (with $processor set to it) returns at least one series; one that
    reads only ``PARSED_ONLY`` series is accepted by Prometheus's query API (a query
    that finds no data succeeds, a syntax error does not). The processor variable's
    label_values query finds the processor."""
    name = scraped_processor.name
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
