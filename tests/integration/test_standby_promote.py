"""A static standby promoted inside its running process, through ``kasper standby
promote`` and the process's admin endpoint, on the real broker: the old owner, killed
with a transaction open, is fenced (its writes aborted, never in the promoted copy), the
copy reads only the changelog's tail, and the counts, changelog and committed offsets
are exact. A partition the process owns, or one that does not exist, is refused and
changes nothing; one kept warm nowhere is adopted and restored in full."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import KafkaException

from kasper_py.kafka.topics import changelog_topic
from tests.kafka_clients import Producer

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
pytest.register_assert_rewrite("conftest_stores")
from conftest_stores import free_port, wait_for  # isort: skip  # noqa: E402
from test_cli import kasper_command  # isort: skip  # noqa: E402
from test_standby import (  # isort: skip  # noqa: E402
    keyed, level, read_table, run, stop, table_metric)

pytest_plugins = ["conftest_stores"]
EOS = ("--processing-guarantee", "exactly_once")


def standby(action: str, admin: int, partitions: str) -> subprocess.CompletedProcess[str]:
    """``kasper standby ACTION`` of ``partitions`` at the admin port ``admin``."""
    return subprocess.run([*kasper_command(), "standby", action, "--endpoint",
                           f"http://127.0.0.1:{admin}", "--partitions", partitions],
                          capture_output=True, text=True, timeout=120, check=False)


def promote(admin: int, partitions: str) -> subprocess.CompletedProcess[str]:
    """``kasper standby promote`` of ``partitions`` at the admin port ``admin``."""
    return standby("promote", admin, partitions)


def test_a_standby_promoted_in_place_fences_the_killed_owner(
        bootstrap, new_topic, kafka, unique_name, tmp_path) -> None:
    """Exactly-once: A owns partition 0, B owns 1 and keeps 0 warm. A is SIGKILLed after
    its turns, and its transactional id is left with a transaction open holding
    changelog writes (a producer with A's id: A dying mid-turn, made certain). Promoting
    1 (owned) or 5 (absent) is refused and nothing committed moves; promoting 0 fences
    A's id (that transaction aborted, its producer refused from then on), restores from
    the warm copy, and B counts on from A's committed offset: the changelog holds each
    write once and none of the aborted ones."""
    topic, name = new_topic("promote", partitions=2), unique_name("promote")
    kafka.produce(topic, keyed("k", 200), partition=0)
    port_b, admin = free_port(), free_port()
    a = run(name, topic, bootstrap, tmp_path / "a", tmp_path / "a.log", *EOS,
            "--input-partitions", "0")
    b = run(name, topic, bootstrap, tmp_path / "b", tmp_path / "b.log", *EOS,
            "--input-partitions", "1", "--standby-partitions", "0", "--metrics-port",
            str(port_b), "--admin-port", str(admin))
    changelog = changelog_topic(name, "counts")
    try:
        wait_for(lambda: kafka.committed(name, topic, 2)[0] == 200, "the first keys", 60)
        wait_for(lambda: level(port_b, name, bootstrap, [0]), "the standby to be level", 30)
        a.kill()
        a.wait(30)
        zombie = open_transaction(bootstrap, f"{name}@0", changelog)
        assert_refused(admin)
        assert kafka.committed(name, topic, 2) == {0: 200, 1: None}
        done = promote(admin, "0")
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        assert answer["partitions"] == [0] and answer["owned"] == [0, 1]
        assert answer["fenced"] == [f"{name}@0"] and answer["from_standby"] is True
        assert answer["restored"] == table_metric(port_b, "last_restore_records", name)[0]
        assert answer["restored"] == 0  # level before the kill; the zombie's writes aborted
        assert table_metric(port_b, "last_restore_from_standby", name) == {0: 1, 1: 0}
        with pytest.raises(KafkaException, match=r"(?i)fenc"):
            zombie.commit_transaction(10)
        kafka.produce(topic, [("k1", "again"), ("new", "x")], partition=0)
        wait_for(lambda: kafka.committed(name, topic, 2)[0] == 202, "B's turn", 60)
        assert "kasper.promoted" in (tmp_path / "b.log").read_text()
    finally:
        stop(b)
        a.kill()
    records = [(m.key().decode(), int(m.value())) for m in kafka.read_all(changelog)
               if m.partition() == 0]
    expected = Counter({(f"k{i}", 1): 1 for i in range(200)})
    expected.update([("k1", 2), ("new", 1)])
    assert Counter(records) == expected
    counts = read_table(tmp_path / "b" / name / "counts")
    assert counts == {**{f"k{i}": 1 for i in range(200)}, "k1": 2, "new": 1}


def assert_refused(admin: int) -> None:
    """Promoting partition 1 (owned) or 5 (absent) exits 5 with the reason."""
    for partitions, said in (("1", "already owns partitions [1]"),
                             ("5", "partitions [5] do not exist")):
        refused = promote(admin, partitions)
        assert (refused.returncode, refused.stdout) == (5, "")
        assert said in refused.stderr


def open_transaction(bootstrap: str, transactional_id: str, changelog: str) -> Producer:
    """A producer holding ``transactional_id`` with a transaction open that wrote
    counts of 999 (and a key of its own) to partition 0 of ``changelog``."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id})
    producer.init_transactions(30)
    producer.begin_transaction()
    for key in (b"k0", b"k1", b"zombie"):
        producer.produce(changelog, b"999", key, partition=0)
    assert producer.flush(30) == 0
    return producer


def test_a_partition_kept_warm_nowhere_is_adopted_and_restored_in_full(
        bootstrap, new_topic, kafka, unique_name, tmp_path) -> None:
    """At-least-once: A owns partition 0, B owns 1 and keeps nothing warm. A is stopped;
    B adopts 0 through the CLI, restores the whole changelog (not from a standby), and
    counts on from A's committed offset."""
    topic, name = new_topic("adopt", partitions=2), unique_name("adopt")
    kafka.produce(topic, keyed("k", 150), partition=0)
    port_b, admin = free_port(), free_port()
    a = run(name, topic, bootstrap, tmp_path / "a", tmp_path / "a.log",
            "--input-partitions", "0")
    b = run(name, topic, bootstrap, tmp_path / "b", tmp_path / "b.log",
            "--input-partitions", "1", "--metrics-port", str(port_b), "--admin-port",
            str(admin))
    try:
        wait_for(lambda: kafka.committed(name, topic, 2)[0] == 150, "the first keys", 60)
        stop(a)
        done = promote(admin, "0")
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        assert (answer["restored"], answer["from_standby"], answer["fenced"]) == (150, False, [])
        assert table_metric(port_b, "last_restore_from_standby", name) == {0: 0, 1: 0}
        kafka.produce(topic, [("k0", "x")], partition=0)
        wait_for(lambda: kafka.committed(name, topic, 2)[0] == 151, "B's turn", 60)
    finally:
        stop(b)
        a.kill()
    counts = read_table(tmp_path / "b" / name / "counts")
    assert counts == {**{f"k{i}": 1 for i in range(150)}, "k0": 2}
