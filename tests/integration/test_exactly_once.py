"""Exactly-once on the real broker: kill -9 during a RocksDB word count with a
passthrough output, a second process fencing the first, an aborted transaction after a
refused delivery, and the at-least-once refusal of a second loop (``--force``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError

from kasper_py import Config, ProduceError, TopicProcessor
from kasper_py.kafka.consumer import InputConsumer
from kasper_py.kafka.offsets import CommitNote
from kasper_py.kafka.producer import OutputProducer
from kasper_py.stores.rocksdb import RocksDBTable

sys.path.insert(0, str(Path(__file__).parent))
pytest.register_assert_rewrite("conftest_stores")
from conftest_stores import (  # isort: skip  # noqa: E402
    kill_randomly_then_finish, read_counts, worker_args, wait_for)
from test_hot_path import Forward  # isort: skip  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


def produce_keyed_words(kafka: Any, topic: str, count: int, partitions: int) -> list[str]:
    """Message i has key ``str(i)`` and value ``w<i % 53>``, dealt round-robin over the
    partitions; returns the words in key order."""
    words = [f"w{i % 53}" for i in range(count)]
    for partition in range(partitions):
        kafka.produce(topic, [(str(i).encode(), words[i].encode())
                              for i in range(partition, count, partitions)],
                      partition=partition)
    return words


def keys_read_committed(kafka: Any, topic: str) -> Counter[bytes]:
    """How often each key is in ``topic``, as a read_committed consumer sees it."""
    return Counter(m.key() for m in kafka.read_all(topic))


def eos_config(bootstrap: str, name: str, topic: str, state_dir: Path) -> Config:
    return Config(name=name, bootstrap_servers=bootstrap, input_topics=[topic],
                  state_dir=str(state_dir), key_serde="str", value_serde="str",
                  processing_guarantee="exactly_once")


def committed_total(kafka: Any, name: str, topic: str, partitions: int) -> Callable[[], int]:
    return lambda: sum(o or 0 for o in kafka.committed(name, topic, partitions).values())


def test_kill_minus_nine_loses_and_repeats_nothing(bootstrap, new_topic, kafka, unique_name,
                                                    tmp_path) -> None:
    """300,000 messages, SIGKILL at five random moments, then run to the end: a
    read_committed reader sees every input's output exactly once, the table holds the
    exact counts, and a table restored from scratch from its changelog agrees."""
    partitions, total, kills = 2, 300_000, 5
    topic, output = new_topic("words", partitions=partitions), new_topic("out", partitions=2)
    name = unique_name("eos-kill")
    words = produce_keyed_words(kafka, topic, total, partitions)
    args = worker_args("rocksdb", bootstrap, name, topic, 2000, "--state-dir", str(tmp_path),
                       "--exactly-once", "--output", output, "--pause", "0.02")
    at_kill = kill_randomly_then_finish(args, kills, committed_total(kafka, name, topic, 2),
                                        total)
    assert len(at_kill) == kills
    assert kafka.committed(name, topic, partitions) == {0: total // 2, 1: total // 2}
    seen = keys_read_committed(kafka, output)
    assert len(seen) == total and set(seen.values()) == {1}
    cfg = eos_config(bootstrap, name, topic, tmp_path)
    expected = Counter(words)
    assert read_counts(RocksDBTable("counts"), cfg, partitions, list(expected)) == expected
    shutil.rmtree(tmp_path / name / "counts")  # from scratch: the changelog alone
    assert read_counts(RocksDBTable("counts"), cfg, partitions, list(expected)) == expected




def start_worker(args: list[str]) -> subprocess.Popen[bytes]:
    worker = subprocess.Popen(args, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert worker.stdout is not None and worker.stdout.readline() == b"started\n"
    return worker


def test_a_second_process_fences_the_first(bootstrap, new_topic, kafka, unique_name,
                                           tmp_path) -> None:
    """Process B starts on process A's partitions while A runs: A stops with FencedError
    naming the partitions and B; B finishes; every input's output is there exactly once
    and the counts are exact."""
    partitions, total = 2, 20_000
    topic, output = new_topic("words", partitions=partitions), new_topic("out", partitions=2)
    name = unique_name("eos-fence")
    words = produce_keyed_words(kafka, topic, total, partitions)
    common = ["--exactly-once", "--output", output, "--pause", "0.1"]
    first = start_worker(worker_args("rocksdb", bootstrap, name, topic, 200, "--state-dir",
                                     str(tmp_path / "a"), *common))
    done = committed_total(kafka, name, topic, partitions)
    wait_for(lambda: done() > 0, "the first process to commit")
    second = subprocess.Popen(
        worker_args("rocksdb", bootstrap, name, topic, 200, "--state-dir",
                    str(tmp_path / "b"), *common[:-2], "--until-caught-up"),
        env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, first_err = first.communicate(timeout=120)
    assert first.returncode != 0
    text = first_err.decode()
    assert "FencedError" in text and "was fenced" in text, text[-2000:]
    assert "partitions all" in text and f"(pid {second.pid})" in text, text[-2000:]
    second.communicate(timeout=300)
    assert second.returncode == 0
    assert kafka.committed(name, topic, partitions) == {0: total // 2, 1: total // 2}
    seen = keys_read_committed(kafka, output)
    assert len(seen) == total and set(seen.values()) == {1}
    cfg = eos_config(bootstrap, name, topic, tmp_path / "b")
    expected = Counter(words)
    assert read_counts(RocksDBTable("counts"), cfg, partitions, list(expected)) == expected


def test_at_least_once_refuses_a_second_loop_unless_forced(bootstrap, new_topic, kafka,
                                                           unique_name, tmp_path) -> None:
    """While a loop runs (its commit note is fresh), a second one on the same partitions
    stops at start with AlreadyRunningError naming the first; with --force it starts."""
    topic = new_topic("words")
    name = unique_name("busy")
    produce_keyed_words(kafka, topic, 5_000, 1)
    args = worker_args("rocksdb", bootstrap, name, topic, 50, "--pause", "0.2")
    first = start_worker([*args, "--state-dir", str(tmp_path / "a")])
    try:
        done = committed_total(kafka, name, topic, 1)
        wait_for(lambda: done() > 0, "the first loop to commit")
        refused = subprocess.run([*args, "--state-dir", str(tmp_path / "b")], env=ENV, check=False,
                                 capture_output=True, timeout=120)
        assert refused.returncode != 0
        text = refused.stderr.decode()
        assert "AlreadyRunningError" in text and "another loop is running" in text, text[-2000:]
        assert f"(pid {first.pid})" in text and "--force" in text
        forced = start_worker([*args, "--state-dir", str(tmp_path / "c"), "--force"])
        forced.kill()
        forced.wait(30)
    finally:
        first.kill()
        first.wait(30)


def test_a_refused_delivery_aborts_the_transaction(bootstrap, new_topic, kafka,
                                                   unique_name) -> None:
    """One output of the second batch is refused: the loop stops with ProduceError, the
    first batch's outputs and offsets are committed, nothing of the second batch is
    visible to read_committed readers (the rest of its outputs were written, then
    aborted), and a restart completes with every output exactly once."""
    source = new_topic("in")
    output = new_topic("out", **{"max.message.bytes": "2000"})
    values = [b"m%03d" % i for i in range(300)]
    kafka.produce(source, values, partition=0)
    cfg = Config(name=unique_name("eos-refused"), bootstrap_servers=bootstrap,
                 input_topics=[source], batch_size=100, batch_wait=0.5,
                 processing_guarantee="exactly_once")
    loop = TopicProcessor(cfg, lambda _c: Forward(output, oversized=150))
    with pytest.raises(ProduceError, match=rf"delivery to {output}\[0\] failed") as info:
        loop.run_loop(until_caught_up=True)
    assert info.value.code == KafkaError.MSG_SIZE_TOO_LARGE
    assert kafka.committed(cfg.name, source) == {0: 100}
    assert sorted(m.value() for m in kafka.read_all(output)) == values[:100]
    again = TopicProcessor(cfg, lambda _c: Forward(output))
    again.run_loop(until_caught_up=True)
    again.close()
    assert kafka.committed(cfg.name, source) == {0: 300}
    assert sorted(m.value() for m in kafka.read_all(output)) == values


def test_start_note_names_the_partition_set(bootstrap, new_topic, kafka, unique_name) -> None:
    """An exactly-once loop's commits carry a note naming its partition set, the key to
    telling a loop on the same partitions (fenced) from an overlapping one (refused)."""
    source = new_topic("in", partitions=2)
    kafka.produce(source, [b"a", b"b"], partition=1)
    cfg = Config(name=unique_name("eos-note"), bootstrap_servers=bootstrap,
                 input_topics=[source], input_partitions=[1], batch_wait=0.2,
                 processing_guarantee="exactly_once")
    loop = TopicProcessor(cfg, lambda _c: Forward(source))
    loop.run_loop(until_caught_up=True)
    loop.close()
    reader = InputConsumer(cfg)
    notes = [CommitNote.decode(m) for m in reader.notes([(source, 1)]).values()]
    reader.close()
    assert [n.partitions for n in notes if n is not None] == ["1"]
    assert cfg.transactional_id == f"{cfg.name}@1"


def test_outstanding_falls_to_zero_without_a_flush(bootstrap, new_topic) -> None:
    """Acked messages stop counting as outstanding without flush(): the loop reads ahead
    until its acks are in, so the count must fall on its own."""
    topic = new_topic("out")
    cfg = Config(name="outstanding", bootstrap_servers=bootstrap, input_topics=[topic])
    producer = OutputProducer(cfg)
    producer.produce([(topic, b"x", None, 0, None, None)] * 100)
    deadline = time.monotonic() + 30
    while producer.outstanding() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert producer.outstanding() == 0
    producer.close()


ZOMBIE = """
import os, sys
from confluent_kafka import Consumer, Producer, TopicPartition
bootstrap, transactional_id, group, topic = sys.argv[1:5]
producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id})
producer.init_transactions(30)
producer.begin_transaction()
producer.produce(topic, b"never committed", partition=0)
producer.flush(30)
consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
producer.send_offsets_to_transaction([TopicPartition(topic, 0, 1)],
                                     consumer.consumer_group_metadata(), 30)
os.kill(os.getpid(), 9)  # dies inside the transaction: its offsets stay pending
"""


def test_a_loop_starts_over_a_killed_loops_open_transaction(bootstrap, new_topic, kafka,
                                                            unique_name) -> None:
    """A loop killed inside a transaction leaves pending offsets, which read_committed
    offset reads wait on until the transaction ends. The next loop takes the
    transactional id over first (aborting it), so it starts at once, processes every
    input once, and the aborted record is never visible."""
    source = new_topic("in")
    kafka.produce(source, [b"a", b"b", b"c"], partition=0)
    cfg = Config(name=unique_name("eos-zombie"), bootstrap_servers=bootstrap,
                 input_topics=[source], batch_size=10, batch_wait=0.2,
                 processing_guarantee="exactly_once")
    zombie = subprocess.run([sys.executable, "-c", ZOMBIE, bootstrap, cfg.transactional_id,
                             cfg.group, source], env=ENV, check=False, timeout=60)
    assert zombie.returncode == -9
    output = new_topic("out")
    loop = TopicProcessor(cfg, lambda _c: Forward(output))
    loop.run_loop(until_caught_up=True)
    loop.close()
    assert sorted(m.value() for m in kafka.read_all(output)) == [b"a", b"b", b"c"]
    assert [m.value() for m in kafka.read_all(source)] == [b"a", b"b", b"c"]
    assert kafka.committed(cfg.name, source) == {0: 5}
