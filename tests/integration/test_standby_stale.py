"""Stale queries during a move in group mode, on the real broker: three ``kasper run
--assignment group`` members with query ports and one standby per partition. The owner
of a partition is killed (SIGKILL); until the group notices, ``kasper query --stale``
asked of the member that neither owns nor keeps it warm is sent to the member keeping it
warm, which answers from its copy with its lag, while a lookup without the flag needs
the owner and fails; once the partition moved, its new owner answers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from kasper_py import Config
from kasper_py.exceptions import KasperError
from kasper_py.kafka.admin import KafkaAdmin
from kasper_py.kafka.partitioner import murmur2_partition
from kasper_py.kafka.topics import changelog_topic
from kasper_py.query import Lookup, QueryClient

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
pytest.register_assert_rewrite("conftest_stores")
from conftest_stores import free_port, wait_for  # isort: skip  # noqa: E402
from test_cli import kasper_command  # isort: skip  # noqa: E402
from test_standby import changelog_ends, run, table_metric  # isort: skip  # noqa: E402

pytest_plugins = ["conftest_stores"]
KEYS = 60
SESSION = {"KASPER_CONSUMER__GROUP_PROTOCOL": "classic",
           "KASPER_CONSUMER__SESSION_TIMEOUT_MS": "10000"}
"""A killed member leaves the group after 10 s (the classic protocol's session timeout is
the client's): the stale lookups below run within it, while the partition moves."""


def keys_of(partition: int) -> list[str]:
    """``KEYS`` keys whose murmur2 partition (of two) is ``partition``, where the query
    server looks for them."""
    keys = (f"k{i}" for i in range(10 * KEYS))
    return [k for k in keys if murmur2_partition(k.encode(), 2) == partition][:KEYS]


def owner_endpoints(bootstrap: str, name: str, topic: str) -> dict[int, str]:
    """The query endpoint of each partition's owner, as the group's description says."""
    group = KafkaAdmin(Config(name=name, bootstrap_servers=bootstrap, input_topics=[topic]),
                       consumer=False).group()
    return {p: str(m.query_endpoint) for m in group.members for t, p in m.partitions
            if t == topic}


def group_members(bootstrap: str, name: str, topic: str) -> list[str]:
    """The group's members, as its description lists them."""
    group = KafkaAdmin(Config(name=name, bootstrap_servers=bootstrap, input_topics=[topic]),
                       consumer=False).group()
    return [m.describe() for m in group.members]


def owner_answers(url: str, key: str) -> bool:
    """Whether a lookup of ``key`` without ``stale`` asked of ``url`` is answered."""
    try:
        QueryClient(url).find("counts", key)
    except KasperError:
        return False
    return True


def query(url: str, key: str, *flags: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KASPER_")}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    return subprocess.run([*kasper_command(), "query", "--url", url, *flags, "counts", key],
                          env=env, capture_output=True, text=True, timeout=60, check=False)


def assert_answers_while_moving(other: str, standby: str, key: str) -> None:
    """Asked of ``other``, a stale lookup of ``key`` is answered by ``standby``'s copy
    with its lag 0 (client, header, CLI); a lookup without the flag fails (exit 3): the
    owner it is sent to is dead."""
    assert QueryClient(other).find("counts", key, stale=True) == Lookup(1, None, 0)
    with urllib.request.urlopen(f"{other}/tables/counts/{key}?stale=ok",
                                timeout=10) as answer:
        assert answer.geturl().startswith(standby)
        assert answer.headers["Kasper-Standby-Lag"] == "0"
    stale = query(other, key, "--stale")
    assert (stale.returncode, stale.stdout) == (0, "1\n")
    assert "answered by a standby copy 0 changelog offsets behind" in stale.stderr
    plain = query(other, key)
    assert plain.returncode == 3, plain.stderr
    assert "no query endpoint answered" in plain.stderr


def test_a_stale_query_is_answered_by_the_standby_while_the_partition_moves(
        bootstrap, new_topic, kafka, unique_name, tmp_path) -> None:
    """A owns partition 0, S keeps it warm, N does neither. A is killed: N answers ``kasper
    query --stale`` for a key of partition 0 by sending it to S, whose copy answers with
    its lag (0: it applied the whole changelog), in the header too; without ``--stale``
    the lookup needs A and fails with exit 3. After the move a new key is counted and the
    lookup without the flag is answered by the new owner."""
    topic, name = new_topic("standby-stale", partitions=2), unique_name("standby-stale")
    for partition in (0, 1):
        kafka.produce(topic, [(k, "x") for k in keys_of(partition)], partition=partition)
    ports = [(free_port(), free_port()) for _ in range(3)]
    members = {f"http://127.0.0.1:{q}": run(
        name, topic, bootstrap, tmp_path / str(q), tmp_path / f"{q}.log", "--assignment",
        "group", "--num-standby-replicas", "1", "--metrics-port", str(m), "--query-port",
        str(q), env=SESSION) for m, q in ports}
    metrics = {f"http://127.0.0.1:{q}": m for m, q in ports}
    try:
        wait_for(lambda: kafka.committed(name, topic, 2) == {0: KEYS, 1: KEYS},
                 "the first keys", 60)

        def holding() -> list[str]:
            """The members holding a copy of partition 0, caught up or not."""
            return [url for url, port in metrics.items()
                    if 0 in table_metric(port, "standby_changelog_offset", name)]

        def warm_in() -> list[str]:
            end = changelog_ends(bootstrap, changelog_topic(name, "counts"), [0])[0]
            return [url for url, port in metrics.items()
                    if table_metric(port, "standby_changelog_offset", name).get(0) == end]

        # the group settled with all three in it (members joining a group that has not
        # rebalanced yet each keep every partition warm), and partition 0's one copy
        # caught up: no other member may answer the stale lookup from a copy of its own
        wait_for(lambda: len(group_members(bootstrap, name, topic)) == 3
                 and len(set(owner_endpoints(bootstrap, name, topic).values())) == 2
                 and len(holding()) == 1 and len(warm_in()) == 1,
                 "partition 0 kept warm in one member of a settled group", 60)
        owner = owner_endpoints(bootstrap, name, topic)[0]
        standby = warm_in()[0]
        other = next(url for url in members if url not in (owner, standby))
        key = keys_of(0)[0]
        # the owner after the rebalance is found by its commit note (written within
        # HEARTBEAT_SECONDS when idle): before the kill, a plain lookup reaches it
        wait_for(lambda: owner_answers(other, key), "partition 0's owner found", 60)
        members[owner].kill()
        members[owner].wait(30)

        assert_answers_while_moving(other, standby, key)
        assert owner_endpoints(bootstrap, name, topic).get(0) == owner, "moved too early"

        kafka.produce(topic, [(key, "x")], partition=0)
        wait_for(lambda: kafka.committed(name, topic, 2)[0] == KEYS + 1, "the new owner", 60)
        moved = query(other, key)
        assert (moved.returncode, moved.stdout, moved.stderr) == (0, "2\n", "")
        survivors = [process for url, process in members.items() if url != owner]
        for process in survivors:  # both at once: a clean close each
            process.send_signal(signal.SIGTERM)
        assert [process.wait(60) for process in survivors] == [0, 0]
    finally:
        for process in members.values():
            process.kill()
            process.wait(30)
