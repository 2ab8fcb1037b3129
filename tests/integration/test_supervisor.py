"""`kasper run --processes N` against the stack's Kafka: workers on disjoint partition
sets, a worker killed with -9 restarted with nothing lost, one endpoint for health and
the workers' metrics, and SIGTERM to the supervisor ending with every batch committed."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kasper_py._support.ports import free_ports

sys.path.insert(0, str(Path(__file__).parent))
from test_cli import (  # isort: skip
    cli_env, json_lines, kasper_command, run_args, wait_for, write_config)

pytestmark = pytest.mark.integration


def get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def events(log: Path, name: str) -> list[dict[str, Any]]:
    return [e for e in json_lines(log.read_text(errors="replace")) if e["event"] == name]


def test_two_workers_split_the_partitions_survive_a_kill_and_stop_on_sigterm(
        bootstrap: str, new_topic: Callable[..., str], kafka: Any,
        unique_name: Callable[[str], str], tmp_path: Path) -> None:
    """`--processes 2` on 4 partitions: the workers own {0,1} and {2,3}; a worker killed
    with -9 is restarted (the death and its cause logged); the supervisor's endpoint is
    ready when every worker is and lists both workers' metrics; SIGTERM to the
    supervisor ends with exit 0 and every input committed, each output at least once."""
    source, sink = new_topic("sup-in", partitions=4), new_topic("sup-out", partitions=4)
    name, port = unique_name("sup"), free_ports(3)
    config = write_config(tmp_path, name, source, batch_size=20, metrics_port=port)
    log = tmp_path / "supervisor.log"
    with log.open("wb") as err:
        supervisor = subprocess.Popen(
            [*kasper_command(), *run_args(config, "--processes", "2", "--metrics-host",
                                          "127.0.0.1")],
            env=cli_env(bootstrap, sink), stdout=subprocess.DEVNULL, stderr=err)
    try:
        first = [(f"k{i}".encode(), f"v{i}".encode()) for i in range(400)]
        kafka.produce(source, first)
        committed = lambda: sum(o or 0 for o in kafka.committed(name, source, 4).values())  # noqa: E731
        wait_for(lambda: committed() == 400, "the first 400 inputs to be committed")
        started = events(log, "kasper.started")
        assert sorted(tuple(e["partitions"]) for e in started) == [(0, 1), (2, 3)]
        status, ready = get(f"http://127.0.0.1:{port}/health/ready")
        assert status == 200 and set(ready["workers"]) == {"0", "1"}, ready
        assert [t["targets"] for t in get(f"http://127.0.0.1:{port}/workers")[1]] == [
            [f"127.0.0.1:{port + 1}"], [f"127.0.0.1:{port + 2}"]]

        victim = next(e for e in events(log, "kasper.worker_started") if e["worker"] == 1)
        subprocess.run(["kill", "-9", str(victim["pid"])], check=True)
        wait_for(lambda: any(e["worker"] == 1 and e["restarts"] == 1
                             for e in events(log, "kasper.worker_started")),
                 "the killed worker to be restarted")
        died = [e for e in events(log, "kasper.worker_died") if e["worker"] == 1]
        assert died and died[0]["why"] == "killed by SIGKILL"
        second = [(f"k{i}".encode(), f"v{i}".encode()) for i in range(400, 800)]
        kafka.produce(source, second)
        wait_for(lambda: committed() == 800, "every input to be committed after the restart")
    finally:
        supervisor.send_signal(signal.SIGTERM)
        code = supervisor.wait(90)
    assert code == 0, log.read_text()[-3000:]
    assert committed() == 800
    outputs = Counter(m.value() for m in kafka.read_all(sink))
    assert set(outputs) == {f"V{i}".encode() for i in range(800)}
    assert sum(outputs.values()) - 800 <= 20  # the killed worker's batch in hand, at most


def test_group_workers_share_the_partitions_and_lag_names_them(
        bootstrap: str, new_topic: Callable[..., str], kafka: Any,
        unique_name: Callable[[str], str], tmp_path: Path) -> None:
    """`--processes 2 --assignment group` over two co-partitioned input topics: both
    workers join the group and share the 4 partition numbers, partition p of both topics
    going to one member; `kasper lag` and `offsets show` name each partition's member;
    SIGTERM ends with every input committed."""
    source, sink = new_topic("sup-g-in", partitions=4), new_topic("sup-g-out", partitions=4)
    joined = new_topic("sup-g-joined", partitions=4)
    name = unique_name("sup-group")
    config = write_config(tmp_path, name, source, batch_size=20)
    text = Path(config).read_text().replace(f'input_topics = ["{source}"]',
                                            f'input_topics = ["{source}", "{joined}"]')
    Path(config).write_text(text)
    env = cli_env(bootstrap, sink)
    supervisor = subprocess.Popen(
        [*kasper_command(), *run_args(config, "--processes", "2", "--assignment", "group")],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        kafka.produce(source, [(f"k{i}".encode(), f"v{i}".encode()) for i in range(200)])
        kafka.produce(joined, [(f"k{i}".encode(), f"j{i}".encode()) for i in range(100)])
        committed = lambda: sum(o or 0 for t in (source, joined)  # noqa: E731
                                for o in kafka.committed(name, t, 4).values())
        owners: dict[tuple[str, str], str] = {}

        def members_in_lag() -> set[str]:
            lines = subprocess.run([*kasper_command(), "lag", "--config", config], env=env,
                                   capture_output=True, text=True, check=True).stdout
            rows = [line.split() for line in lines.splitlines()[1:]
                    if line.startswith((source, joined))]
            owners.clear()
            owners.update({(row[0], row[1]): row[3] for row in rows if len(row) == 4})
            return {member for member in owners.values() if member != "-"}

        wait_for(lambda: committed() == 300, "every input to be committed")
        wait_for(lambda: len(members_in_lag()) == 2, "two members to share the partitions")
        assert all(owners[(source, p)] == owners[(joined, p)] for p in "0123"), owners
        shown = subprocess.run([*kasper_command(), "offsets", "show", "--config", config],
                               env=env, capture_output=True, text=True, check=True).stdout
        assert "MEMBER" in shown and "2 members" in shown, shown
    finally:
        supervisor.send_signal(signal.SIGTERM)
        code = supervisor.wait(90)
    assert code == 0
    assert committed() == 300
