"""Standby replicas on the real broker, through ``kasper run`` processes: a standby's
warm copy is promoted by hand and restores only the changelog's tail; a standby paused
with SIGSTOP catches up past an aborted exactly-once turn without ever holding its
writes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from kasper_py.kafka.partitioner import murmur2_partition
from kasper_py.kafka.topics import changelog_topic
from kasper_py.query import Lookup, QueryClient
from kasper_py.stores.localdb import LocalDB
from tests.kafka_clients import Consumer

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
pytest.register_assert_rewrite("conftest_stores")
from conftest_stores import free_port, wait_for  # isort: skip  # noqa: E402
from test_cli import kasper_command  # isort: skip  # noqa: E402

pytest_plugins = ["conftest_stores"]
SAMPLE = re.compile(r'^kasper_(\w+)\{([^}]*)\} (\S+)$', re.M)


def run(name: str, topic: str, bootstrap: str, state: Path, log: Path, *flags: str,
        env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """``kasper run standby_module:Count`` in the background, its output in ``log``."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("KASPER_")}
    full_env.update(PYTHONPATH=os.pathsep.join([str(HERE), *sys.path]), **(env or {}))
    command = [*kasper_command(), "run", "standby_module:Count", "--stores",
               "standby_module:stores", "--app-dir", str(HERE), "--name", name,
               "--bootstrap-servers", bootstrap, "--input-topics", topic,
               "--batch-wait", "0.2", "--log-format", "console",
               *flags]
    with log.open("ab") as out:
        return subprocess.Popen(command, env={**full_env, "KASPER_KEY_SERDE": "str",
                                              "KASPER_VALUE_SERDE": "str",
                                              "KASPER_STATE_DIR": str(state)},
                                stdout=out, stderr=subprocess.STDOUT)


def table_metric(port: int, metric: str, name: str) -> dict[int, float]:
    """``kasper_<metric>`` of the "counts" table per partition, from /metrics ({} while
    the server is not up)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except (urllib.error.URLError, ConnectionError):
        return {}
    found = {}
    for sample, labels, value in SAMPLE.findall(text):
        fields = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if sample == metric and fields.get("processor") == name:
            found[int(fields["partition"])] = float(value)
    return found


def level(port: int, name: str, bootstrap: str, partitions: list[int]) -> bool:
    """The standby's warm copy of each partition applied its changelog to the end."""
    applied = table_metric(port, "standby_changelog_offset", name)
    ends = changelog_ends(bootstrap, changelog_topic(name, "counts"), partitions)
    return applied == {p: float(end) for p, end in ends.items()}


def changelog_ends(bootstrap: str, topic: str, partitions: list[int]) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "standby-test"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in partitions}
    finally:
        consumer.close()


def stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    assert process.wait(60) == 0


def keyed(prefix: str, count: int) -> list[tuple[str, str]]:
    return [(f"{prefix}{i}", "x") for i in range(count)]


def test_a_standby_promoted_by_hand_restores_only_the_tail(
        bootstrap, new_topic, kafka, unique_name, tmp_path) -> None:
    """A owns partitions 0-1, B owns 2 and keeps 0-1 warm. B is frozen (SIGSTOP), more
    keys arrive and A counts them, A stops, B is killed; B restarted as owner of every
    partition restores from its warm files exactly the records written after it froze
    (the metric says so, and that it started from a standby), and every count is exact."""
    topic, name = new_topic("standby", partitions=3), unique_name("standby")
    first = {p: keyed(f"p{p}-", 300) for p in range(3)}
    for partition, records in first.items():
        kafka.produce(topic, records, partition=partition)
    port_a, port_b, query_a, query_b = free_port(), free_port(), free_port(), free_port()
    a = run(name, topic, bootstrap, tmp_path / "a", tmp_path / "a.log", "--input-partitions",
            "0,1", "--metrics-port", str(port_a), "--query-port", str(query_a))
    b = run(name, topic, bootstrap, tmp_path / "b", tmp_path / "b.log", "--input-partitions",
            "2", "--standby-partitions", "0,1", "--metrics-port", str(port_b),
            "--query-port", str(query_b))
    try:
        committed = lambda: kafka.committed(name, topic, 3)  # noqa: E731
        wait_for(lambda: committed() == {0: 300, 1: 300, 2: 300}, "the first keys", 60)
        wait_for(lambda: level(port_b, name, bootstrap, [0, 1]), "the standby to be level", 30)
        assert_stale_answers(query_b)
        b.send_signal(signal.SIGSTOP)
        tail = {0: keyed("t0-", 40), 1: keyed("t1-", 25)}
        for partition, records in tail.items():
            kafka.produce(topic, records, partition=partition)
        wait_for(lambda: committed() == {0: 340, 1: 325, 2: 300}, "the tail's keys", 60)
        stop(a)
    finally:
        b.kill()
        b.wait(30)
        a.kill()
    port = free_port()
    owner = run(name, topic, bootstrap, tmp_path / "b", tmp_path / "b2.log",
                "--force", "--metrics-port", str(port))
    try:
        wait_for(lambda: len(table_metric(port, "last_restore_records", name)) == 3,
                 "the restores", 60)
        assert table_metric(port, "last_restore_records", name) == {0: 40, 1: 25, 2: 0}
        assert table_metric(port, "last_restore_from_standby", name) == {0: 1, 1: 1, 2: 0}
        kafka.produce(topic, [("p0-0", "x")], partition=0)
        wait_for(lambda: kafka.committed(name, topic, 3)[0] == 341, "one more key", 60)
        # The turn applied to partition 0 reports its keys: 340 (RocksDB's estimate may
        # count the rewritten key's two versions until they are compacted).
        wait_for(lambda: 0 in table_metric(port, "store_keys", name), "the keys gauge", 30)
        assert 340 <= table_metric(port, "store_keys", name)[0] <= 341
    finally:
        stop(owner)
    counts = read_table(tmp_path / "b" / name / "counts")
    expected = {key: 1 for records in (*first.values(), *tail.values()) for key, _ in records}
    expected["p0-0"] = 2
    assert counts == expected


def assert_stale_answers(query_port: int) -> None:
    """The standby answers a key of a partition it keeps warm (0 or 1, written where the
    query server looks for it) only when asked for a stale answer, saying its lag (header
    and body); otherwise the owner answers."""
    key = next(f"p{p}-{i}" for i in range(300) for p in (0, 1)
               if murmur2_partition(f"p{p}-{i}".encode(), 3) == p)
    client = QueryClient(f"http://127.0.0.1:{query_port}")
    assert client.find("counts", key, stale=True) == Lookup(1, None, 0)
    assert client.find("counts", key) == Lookup(1, None, None)
    url = f"http://127.0.0.1:{query_port}/tables/counts/{key}?stale=ok"
    with urllib.request.urlopen(url, timeout=10) as answer:
        assert answer.headers["Kasper-Standby-Lag"] == "0"


def read_table(folder: Path) -> dict[str, int]:
    """Every (key, count) of the table's partition folders under ``folder``."""
    counts = {}
    for path in sorted(folder.iterdir()):
        db = LocalDB(path)
        try:
            counts.update({key.decode(): int(value) for key, value in db.items()})
        finally:
            db.close()
    return counts


def test_a_paused_standby_catches_up_past_an_aborted_turn(
        bootstrap, new_topic, kafka, unique_name, tmp_path) -> None:
    """Exactly-once: B keeps A's partition 0 warm. B is paused (SIGSTOP); A's turn with a
    ``fail`` message writes its changelog records, then fails (its send is larger than the
    output topic takes): the transaction is aborted and A exits non-zero. B resumes, catches
    up to the changelog's end, and its copy holds the committed counts and none of the
    aborted turn's writes."""
    topic, name = new_topic("standby-eos", partitions=2), unique_name("standby-eos")
    output = new_topic("standby-out", partitions=1, **{"max.message.bytes": "1000"})
    kafka.produce(topic, keyed("k", 200), partition=0)
    port_b = free_port()
    eos = ("--processing-guarantee", "exactly_once")
    a = run(name, topic, bootstrap, tmp_path / "a", tmp_path / "a.log", *eos,
            "--input-partitions", "0", env={"STANDBY_OUTPUT_TOPIC": output})
    b = run(name, topic, bootstrap, tmp_path / "b", tmp_path / "b.log", *eos,
            "--input-partitions", "1", "--standby-partitions", "0", "--metrics-port",
            str(port_b))
    try:
        wait_for(lambda: kafka.committed(name, topic, 2)[0] == 200, "the first keys", 60)
        wait_for(lambda: level(port_b, name, bootstrap, [0]), "the standby to be level", 30)
        b.send_signal(signal.SIGSTOP)
        before = changelog_ends(bootstrap, changelog_topic(name, "counts"), [0])[0]
        kafka.produce(topic, [("k1", "again"), ("aborted", "x"), ("k2", "fail")], partition=0)
        assert a.wait(90) != 0
        # the aborted turn's writes (k1, k2, aborted) and its abort marker
        assert changelog_ends(bootstrap, changelog_topic(name, "counts"), [0])[0] >= before + 4
        b.send_signal(signal.SIGCONT)
        wait_for(lambda: level(port_b, name, bootstrap, [0]), "the standby to catch up", 30)
        stop(b)
    finally:
        for process in (a, b):
            process.send_signal(signal.SIGCONT)
            process.kill()
            process.wait(30)
    assert "Message size too large" in (tmp_path / "a.log").read_text(errors="replace")
    assert kafka.committed(name, topic, 2)[0] == 200
    counts = read_table(tmp_path / "b" / name / "counts")
    assert counts == {f"k{i}": 1 for i in range(200)}


def test_processes_place_each_workers_partitions_warm_in_the_next(
        bootstrap, new_topic, kafka, unique_name, tmp_path) -> None:
    """``kasper run --processes 2 --num-standby-replicas 1`` on 4 partitions: worker 0
    owns 0-1 and keeps 2-3 warm, worker 1 the reverse; each warm copy reaches the
    changelog's end. Each worker serves its own admin endpoint (A, A+1), which refuses
    to promote a partition the worker owns."""
    topic, name = new_topic("standby-workers", partitions=4), unique_name("standby-workers")
    for partition in range(4):
        kafka.produce(topic, keyed(f"p{partition}-", 50), partition=partition)
    port, admin = free_port(3), free_port(2)  # the supervisor P, its workers P+1 and P+2
    supervisor = run(name, topic, bootstrap, tmp_path / "state", tmp_path / "run.log",
                     "--processes", "2", "--num-standby-replicas", "1",
                     "--metrics-port", str(port), "--admin-port", str(admin))
    try:
        wait_for(lambda: kafka.committed(name, topic, 4) == dict.fromkeys(range(4), 50),
                 "every key", 60)
        wait_for(lambda: level(port + 1, name, bootstrap, [2, 3]), "worker 0's copies", 30)
        wait_for(lambda: level(port + 2, name, bootstrap, [0, 1]), "worker 1's copies", 30)
        for worker, owned in ((0, "1"), (1, "3")):
            refused = subprocess.run(
                [*kasper_command(), "standby", "promote", "--endpoint",
                 f"http://127.0.0.1:{admin + worker}", "--partitions", owned],
                capture_output=True, text=True, timeout=60, check=False)
            assert refused.returncode == 5
            assert f"already owns partitions [{owned}]" in refused.stderr
    finally:
        stop(supervisor)
