"""Standby replicas in group mode on the real broker: three ``kasper run --assignment
group`` members under exactly-once, one partition of each table kept warm in one other
member (``--num-standby-replicas 1``). The owner of a partition is killed; the member
that kept it warm is assigned it and promotes its copy in place, reading only what the
copy lacked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from kasper_py import Config
from kasper_py.kafka.admin import GroupState, KafkaAdmin
from kasper_py.kafka.topics import changelog_topic
from kasper_py.stores.localdb import LocalDB
from tests.kafka_clients import Consumer

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
pytest.register_assert_rewrite("conftest_stores")
from conftest_stores import free_port, wait_for  # isort: skip  # noqa: E402
from test_cli import kasper_command  # isort: skip  # noqa: E402
from test_standby import changelog_ends, keyed, run, stop, table_metric  # isort: skip  # noqa: E402

pytest_plugins = ["conftest_stores"]
KEYS = 400
TAIL = 40


def member(name: str, topic: str, bootstrap: str, state: Path, *, client_id: str,
           metrics_port: int) -> subprocess.Popen[bytes]:
    """One group member under exactly-once; with two standbys per partition and three
    members, every member keeps warm what it does not own, so whichever survivor the
    assignor picks is warm (with one, the odds are one in two: docs/stores.md)."""
    return run(name, topic, bootstrap, state, state.with_suffix(".log"),
               "--assignment", "group", "--num-standby-replicas", "2",
               "--processing-guarantee", "exactly_once", "--metrics-port", str(metrics_port),
               env={"KASPER_CONSUMER__CLIENT_ID": client_id})


def described(bootstrap: str, name: str, topic: str) -> GroupState:
    return KafkaAdmin(Config(name=name, bootstrap_servers=bootstrap, input_topics=[topic]),
                      consumer=False).group()


def owners(bootstrap: str, name: str, topic: str) -> dict[int, str]:
    """Which member (a, b or c) owns each partition of ``topic``, as the group says."""
    found = described(bootstrap, name, topic).owners()
    return {p: owner.split("@")[0].removeprefix(f"{name}-") for (t, p), owner in found.items()
            if t == topic}


def warm(port: int, name: str, bootstrap: str, partitions: list[int]) -> bool:
    """The member's copies of ``partitions`` applied their changelogs to the end."""
    applied = table_metric(port, "standby_changelog_offset", name)
    ends = changelog_ends(bootstrap, changelog_topic(name, "counts"), partitions)
    return all(applied.get(p) == float(end) for p, end in ends.items())


def settled_and_warm(bootstrap: str, name: str, topic: str, ports: dict[str, int]) -> bool:
    """Two owners (range over three members and two partitions leaves one idle), and
    every member's copies of the partitions it does not own level with the changelog."""
    now = owners(bootstrap, name, topic)
    return (len(set(now.values())) == 2 and len(now) == 2
            and all(warm(port, name, bootstrap, [p for p, o in now.items() if o != m])
                    for m, port in ports.items())
            and owners(bootstrap, name, topic) == now)


def lag_standbys(bootstrap: str, name: str, topic: str) -> dict[int, set[str]]:
    """The STANDBYS column of ``kasper lag`` (a config of group mode, two replicas)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KASPER_")}
    env.update(PYTHONPATH=os.pathsep.join(sys.path), KASPER_ASSIGNMENT="group",
               KASPER_NUM_STANDBY_REPLICAS="2")
    out = subprocess.run([*kasper_command(), "lag", "--name", name, "--bootstrap-servers",
                          bootstrap, "--input-topics", topic], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    lines = out.splitlines()
    assert lines[0].split() == ["TOPIC", "PARTITION", "LAG", "MEMBER", "STANDBYS"]
    return {int(row.split()[1]): set(row.split()[4].split(",")) for row in lines[1:3]}


def assert_promoted(port: int, name: str, partition: int) -> None:
    """The member on ``port`` opened ``partition`` from its warm copy, restoring nothing
    the copy lacked, and reports no standby lag for it any more."""
    wait_for(lambda: partition in table_metric(port, "last_restore_records", name),
             "the promotion", 30)
    assert table_metric(port, "last_restore_records", name)[partition] == 0
    assert table_metric(port, "last_restore_from_standby", name)[partition] == 1
    assert partition not in table_metric(port, "standby_lag_records", name)


def read_partition(folder: Path) -> dict[str, int]:
    db = LocalDB(folder)
    try:
        return {key.decode(): int(value) for key, value in db.items()}
    finally:
        db.close()


def never_committed(bootstrap: str, group: str, topic: str) -> bool:
    """The standby's changelog readers' group holds no committed offset."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in (0, 1)], timeout=10)
        return all(tp.offset < 0 for tp in found)
    finally:
        consumer.close()


def test_a_killed_owners_partition_is_promoted_from_a_warm_copy(
        bootstrap, new_topic, kafka, unique_name, tmp_path) -> None:
    """Three members share two partitions, each keeping warm what it does not own. The
    owner of partition 0 is killed (SIGKILL) and more keys arrive: each partition that
    moves is promoted in its new owner from its warm copy without a restart (the restore
    metric says it started from a standby and read nothing its copy lacked), and the new
    keys are counted. Every count is exact, the committed offsets are the input's ends,
    and the standbys never committed anything."""
    topic, name = new_topic("standby-group", partitions=2), unique_name("standby-group")
    for partition in (0, 1):
        kafka.produce(topic, keyed(f"p{partition}-", KEYS), partition=partition)
    ports = {m: free_port() for m in "abc"}
    members = {m: member(name, topic, bootstrap, tmp_path / m, client_id=f"{name}-{m}",
                         metrics_port=ports[m]) for m in "abc"}
    try:
        committed = lambda: kafka.committed(name, topic, 2)  # noqa: E731
        wait_for(lambda: committed() == {0: KEYS, 1: KEYS}, "the first keys", 60)
        wait_for(lambda: settled_and_warm(bootstrap, name, topic, ports),
                 "a settled group with every copy warm", 60)
        before = owners(bootstrap, name, topic)
        assert lag_standbys(bootstrap, name, topic) == {
            p: {f"{name}-{m}@127.0.0.1" for m in "abc" if m != owner}
            for p, owner in before.items()}
        killed = before[0]
        members[killed].kill()
        members[killed].wait(30)
        kafka.produce(topic, [*keyed("t0-", TAIL), ("p0-0", "x")], partition=0)
        wait_for(lambda: committed()[0] == KEYS + TAIL + 1, "the new owner's turn", 50)
        wait_for(lambda: len(set(owners(bootstrap, name, topic).values())) == 2,
                 "the survivors' assignment", 30)
        after = owners(bootstrap, name, topic)
        moved = {p: owner for p, owner in after.items() if before.get(p) != owner}
        assert 0 in moved
        for partition, owner in moved.items():
            assert_promoted(ports[owner], name, partition)
        for m in ports:
            if m != killed:
                stop(members[m])
    finally:
        for process in members.values():
            process.kill()
            process.wait(30)
    counts = read_partition(tmp_path / after[0] / name / "counts" / "0")
    expected = {key: 1 for key, _ in [*keyed("p0-", KEYS), *keyed("t0-", TAIL)]}
    assert counts == {**expected, "p0-0": 2}
    assert read_partition(tmp_path / after[1] / name / "counts" / "1") == {
        key: 1 for key, _ in keyed("p1-", KEYS)}
    assert kafka.committed(name, topic, 2) == {0: KEYS + TAIL + 1, 1: KEYS}
    assert never_committed(bootstrap, f"{name}-changelog-reader",
                           changelog_topic(name, "counts"))
