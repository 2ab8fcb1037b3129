"""`kasper run --assignment group --until-caught-up` as a batch job trusts it: exit 0
means the group committed every partition of the input topics to its end, not only
the partitions this member happened to be assigned (killed members hold theirs until
their sessions expire). The input is written in transactions, as an exactly-once
processor upstream writes it, so each partition ends after a commit marker that no
reader is given. Subprocesses against the stack's Kafka, fresh topics and group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition

import kasper_py
from tests.kafka_clients import Consumer, Producer

sys.path.insert(0, str(Path(__file__).parent))
pytest.register_assert_rewrite("conftest_stores")
from conftest_stores import wait_for  # isort: skip  # noqa: E402 - after register_assert_rewrite
from test_cli import (  # isort: skip  # noqa: E402
    cli_env, json_lines, kasper, kasper_command, run_args, write_config)

pytestmark = pytest.mark.integration

PARTITIONS = 6
RECORDS = 1200
TRANSACTIONS = 4
MEMBER = ["--assignment", "group", "--processing-guarantee", "exactly_once"]


def env_for(bootstrap: str, sink: str, **extra: str) -> dict[str, str]:
    """``cli_env``, with the package under test first on the subprocesses' path."""
    env = cli_env(bootstrap, sink, **extra)
    here = str(Path(kasper_py.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([here, *filter(None, [env.get("PYTHONPATH")])])
    return env


def produce_in_transactions(bootstrap: str, topic: str) -> None:
    """``RECORDS`` keyed values in ``TRANSACTIONS`` committed transactions."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic}",
                         "partitioner": "murmur2_random"})
    producer.init_transactions(30)
    for first in range(TRANSACTIONS):
        producer.begin_transaction()
        for i in range(first, RECORDS, TRANSACTIONS):
            producer.produce(topic, f"v{i}".encode(), f"k{i}".encode())
        producer.commit_transaction(30)


def held(log: Path) -> set[int]:
    """The partitions a member holds now, from its assigned / revoked log lines."""
    partitions: set[int] = set()
    for line in json_lines(log.read_text(errors="replace")):
        if line.get("event") == "kasper.partitions_assigned":
            partitions |= set(line["partitions"])
        elif line.get("event") == "kasper.partitions_revoked":
            partitions -= set(line["partitions"])
    return partitions


def ends(bootstrap: str, topic: str) -> dict[int, int]:
    """Each partition's end as a read_committed reader sees it (its last stable offset)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "kasper-tests-ends"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(PARTITIONS)}
    finally:
        consumer.close()


def test_until_caught_up_in_group_mode_waits_for_the_whole_group(
        bootstrap: str, new_topic: Callable[..., str], kafka: Any,
        unique_name: Callable[[str], str], tmp_path: Path) -> None:
    """Three slow exactly-once members share 6 partitions; two are killed with -9 while
    they hold uncommitted work, and a member is started at once with `--until-caught-up`.
    It exits 0 only once the group is caught up: read as it exits, the group's committed
    offset of every input partition is that partition's end, the killed members' and the
    slow survivor's included. The survivor then stops on SIGTERM, and a read_committed
    reader sees every input upper-cased exactly once."""
    source = new_topic("grp-in", partitions=PARTITIONS)
    sink = new_topic("grp-out", partitions=PARTITIONS)
    produce_in_transactions(bootstrap, source)
    name = unique_name("grp-caught-up")
    config = write_config(tmp_path, name, source, batch_size=20)
    slow = env_for(bootstrap, sink, EXAMPLE_PAUSE="0.3")
    logs = {m: tmp_path / f"{m}.log" for m in "abc"}
    members: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for m, log in logs.items():
            with log.open("wb") as out:
                members[m] = subprocess.Popen([*kasper_command(), *run_args(config, *MEMBER)],
                                              env=slow, stdout=out, stderr=subprocess.STDOUT)
        wait_for(lambda: all(held(log) for log in logs.values()), "every member to hold "
                 "partitions", timeout=90)
        victims = held(logs["a"]) | held(logs["b"])
        wait_for(lambda: any(kafka.committed(name, source, PARTITIONS)[p] for p in victims),
                 "the members to be killed to commit", timeout=60)
        for m in "ab":
            members[m].kill()
            members[m].wait(30)
        left = kafka.committed(name, source, PARTITIONS)
        assert any((left[p] or 0) < end for p, end in ends(bootstrap, source).items()
                   if p in victims), "the killed members left no work"
        result = kasper(*run_args(config, *MEMBER, "--until-caught-up", "--batch-size", "500"),
                        env=env_for(bootstrap, sink))
        (tmp_path / "until.log").write_text(result.stderr)
        committed, end = kafka.committed(name, source, PARTITIONS), ends(bootstrap, source)
        members["c"].send_signal(signal.SIGTERM)
        assert members["c"].wait(60) == 0
    finally:
        for member in members.values():
            if member.poll() is None:
                member.kill()
                member.wait(30)
    assert result.returncode == 0, result.stderr[-3000:]
    assert committed == end, f"exited 0 with {committed} committed of {end}"
    outputs = sorted(m.value() for m in kafka.read_all(sink))
    assert outputs == sorted(f"V{i}".encode() for i in range(RECORDS))
