"""Co-partitioned inputs aligned through ``kasper run`` on the real broker, with
``max_task_idle`` from the environment: where the table has records, every event meets
the table value of its time; where the table is empty (caught up), the events wait
``max_task_idle`` seconds for it, then go without it, and the log and the metrics
endpoint (``--metrics-port``) say so."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.http_get import get

sys.path.insert(0, str(Path(__file__).parent))
pytest.register_assert_rewrite("conftest_stores")
from conftest_stores import free_port, wait_for  # isort: skip  # noqa: E402 - after register_assert_rewrite

pytestmark = pytest.mark.integration
HERE = Path(__file__).parent
SAMPLE = re.compile(r'^(kasper_alignment_\w+)\{([^}]*)\} (\S+)$', re.M)
BASE = int(time.time() * 1000) - 3_600_000  # an hour ago: within any retention


def test_kasper_run_aligns_inputs_and_logs_the_end_of_an_idle_wait(
        bootstrap: str, new_topic: Callable[..., str], kafka: Any,
        unique_name: Callable[[str], str], tmp_path: Path) -> None:
    """Table values at 0, 1, 2 s in partition 0, none in partition 1; events every
    250 ms in both. Partition 0's events each get the value of their time; partition
    1's get none, after a logged 1.5 s wait on its caught-up table partition. The run
    ends caught up (exit 0) with every offset committed."""
    table, events = new_topic("align-table", 2), new_topic("align-events", 2)
    output = new_topic("align-joined", 2)
    kafka.produce(table, [(b"k", f"t{i}", BASE + 1000 * i) for i in range(3)], partition=0)
    for p in range(2):
        kafka.produce(events, [(b"k", f"e{j}", BASE + 100 + 250 * j) for j in range(10)],
                      partition=p)
    name = unique_name("align-cli")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KASPER_")}
    env.update(KASPER_BOOTSTRAP_SERVERS=bootstrap, KASPER_NAME=name,
               KASPER_INPUT_TOPICS=f"{table},{events}", KASPER_MAX_TASK_IDLE="1.5",
               KASPER_BATCH_WAIT="0.2", KASPER_VALUE_SERDE="str",
               EXAMPLE_TABLE_TOPIC=table, EXAMPLE_OUTPUT_TOPIC=output)
    result = subprocess.run(
        [sys.executable, "-m", "kasper_py", "run", "align_module:factory", "--app-dir",
         str(HERE), "--until-caught-up"], env=env, cwd=tmp_path, capture_output=True,
        text=True, timeout=120, check=False)

    assert result.returncode == 0, result.stderr
    joined = kafka.read_all(output)
    assert [m.value().decode() for m in joined if m.partition() == 0] == [
        f"e{j}:t{(100 + 250 * j) // 1000}" for j in range(10)]
    assert [m.value().decode() for m in joined if m.partition() == 1] == [
        f"e{j}:None" for j in range(10)]
    enforced = [json.loads(line) for line in result.stderr.splitlines()
                if "kasper.alignment_enforced" in line]
    # partition 1 waited for its empty table; partition 0's last events (past the
    # table's last value, 2 s) for more table records
    assert sorted((e["topic"], e["partition"], e["max_task_idle"]) for e in enforced) == [
        (table, 0, 1.5), (table, 1, 1.5)]
    assert all(e["waited"] >= 1.5 for e in enforced)
    assert kafka.committed(name, table, 2) == {0: 3, 1: None}
    assert kafka.committed(name, events, 2) == {0: 10, 1: 10}


def alignment_metrics(port: int) -> dict[tuple[str, ...], float]:
    """The ``kasper_alignment_*`` samples of ``/metrics``: ``(name, topic, partition,
    reason)`` (those it has) to value; {} while the server is not up."""
    try:
        status, text = get(f"http://127.0.0.1:{port}/metrics")
    except OSError:
        return {}
    samples = {}
    for name, labels, value in SAMPLE.findall(text if status == 200 else ""):
        fields = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        key = (name, *(fields[k] for k in ("topic", "partition", "reason") if k in fields))
        samples[key] = float(value)
    return samples


def test_kasper_run_shows_an_enforced_wait_on_its_metrics_endpoint(
        bootstrap: str, new_topic: Callable[..., str], kafka: Any,
        unique_name: Callable[[str], str], tmp_path: Path) -> None:
    """An empty table and three events, max_task_idle 1 s: the metrics endpoint of
    `kasper run` shows one enforced processing past the table's partition, the seconds
    waited (reason max_task_idle) that its log line says, at least the idle second, no
    event left held and no fetch held back; the events went without a table value and
    are committed, and SIGTERM ends the run cleanly."""
    table, events = new_topic("alignm-table", 1), new_topic("alignm-events", 1)
    output = new_topic("alignm-joined", 1)
    kafka.produce(events, [(b"k", f"e{j}", BASE + 100 * j) for j in range(3)], partition=0)
    name, port = unique_name("alignm-cli"), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KASPER_")}
    env.update(KASPER_BOOTSTRAP_SERVERS=bootstrap, KASPER_NAME=name,
               KASPER_INPUT_TOPICS=f"{table},{events}", KASPER_MAX_TASK_IDLE="1.0",
               KASPER_BATCH_WAIT="0.2", KASPER_VALUE_SERDE="str",
               EXAMPLE_TABLE_TOPIC=table, EXAMPLE_OUTPUT_TOPIC=output)
    log = (tmp_path / "run.log").open("wb")
    run = subprocess.Popen(
        [sys.executable, "-m", "kasper_py", "run", "align_module:factory", "--app-dir",
         str(HERE), "--metrics-port", str(port), "--metrics-host", "127.0.0.1"],
        env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    try:
        enforced = ("kasper_alignment_enforced_total", table, "0")
        wait_for(lambda: alignment_metrics(port).get(enforced) == 1,
                 "one enforced processing on the metrics endpoint", timeout=30)
        seen = alignment_metrics(port)
        run.send_signal(signal.SIGTERM)
        assert run.wait(30) == 0, (tmp_path / "run.log").read_text()
    finally:
        if run.poll() is None:
            run.kill()
        log.close()

    [ended] = [json.loads(line) for line in (tmp_path / "run.log").read_text().splitlines()
               if "kasper.alignment_enforced" in line]
    waited = seen[("kasper_alignment_wait_seconds_total", table, "0", "max_task_idle")]
    assert waited == pytest.approx(ended["waited"], abs=0.001)  # the log line's, rounded
    assert waited >= 1.0
    assert seen[("kasper_alignment_enforced_total", table, "0")] == 1
    assert seen[("kasper_alignment_held_records", events, "0")] == 0
    assert seen[("kasper_alignment_held_back_partitions",)] == 0
    assert [m.value().decode() for m in kafka.read_all(output)] == [
        f"e{j}:None" for j in range(3)]
    assert kafka.committed(name, events) == {0: 3}
