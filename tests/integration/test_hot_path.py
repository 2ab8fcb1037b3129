"""The hot path on the real broker: a batch read ahead while acks are outstanding is
never committed before its own turn, a delivery the broker refuses (reported through
failures-only delivery reports) fails its turn uncommitted, ``until_caught_up`` needs
no watermark round trip, and a batch sent at once (``Sender.send_many``) lands where
the Java client would put each key."""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

import pytest
from confluent_kafka import KafkaError

from kasper_py import (
    JSON,
    STRING,
    Config,
    Message,
    MessageProcessor,
    ProduceError,
    Sender,
    TopicProcessor,
)
from kasper_py.kafka.consumer import InputConsumer
from kasper_py.kafka.partitioner import murmur2_partition
from kasper_py.kafka.ports import KafkaClients
from kasper_py.kafka.producer import OutputProducer


class Forward(MessageProcessor):
    """Sends every value on to ``output``; the value at ``oversized`` goes out padded past
    the output topic's max.message.bytes, so the broker refuses its delivery."""

    def __init__(self, output: str, oversized: int | None = None) -> None:
        self.output, self.oversized = output, oversized

    def process(self, messages: list[Message], sender: Sender) -> None:
        for m in messages:
            value = m.value + b"x" * 5000 if m.offset == self.oversized else m.value
            sender.send(self.output, value, partition=m.partition)


def config(bootstrap: str, name: str, source: str) -> Config:
    return Config(name=name, bootstrap_servers=bootstrap, input_topics=[source],
                  batch_size=100, batch_wait=0.5)


def run(cfg: Config, processor: MessageProcessor, clients: KafkaClients | None = None) -> None:
    loop = TopicProcessor(cfg, lambda _c: processor, clients=clients)
    try:
        loop.run_loop(until_caught_up=True)
    finally:
        loop.close()


def test_a_refused_delivery_fails_its_turn_and_leaves_the_batch_read_ahead_uncommitted(
        bootstrap, new_topic, kafka, unique_name) -> None:
    """The broker refuses one output of the second batch (too large for the topic): the
    loop stops with ProduceError naming the output and the uncommitted batch; the first
    batch stays committed and nothing of the second or of the batch read ahead is. A
    restart that sends nothing oversized completes every input."""
    source = new_topic("in")
    output = new_topic("out", **{"max.message.bytes": "2000"})
    values = [b"m%03d" % i for i in range(300)]
    kafka.produce(source, values, partition=0)
    cfg = config(bootstrap, unique_name("refused"), source)
    with pytest.raises(ProduceError, match=rf"delivery to {output}\[0\] failed") as info:
        run(cfg, Forward(output, oversized=150))
    assert info.value.code == KafkaError.MSG_SIZE_TOO_LARGE
    assert f"batch not committed: {source}[0] offsets 100..199" in str(info.value)
    assert kafka.committed(cfg.name, source) == {0: 100}
    run(cfg, Forward(output))
    assert kafka.committed(cfg.name, source) == {0: 300}
    produced = Counter(m.value() for m in kafka.read_all(output))
    assert set(produced) == set(values)
    assert all(n == 1 for v, n in produced.items() if v < b"m100" or v >= b"m200")


class CountingConsumer(InputConsumer):
    """The real consumer, noting each watermark query that goes to the broker although
    a fetch response had already brought the partition's watermarks (the one query
    allowed: a partition with no fetch response yet, as on a loaded machine, where the
    first check can come before the first fetch of a partition answers)."""

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.round_trips: list[tuple[str, int]] = []

    def watermarks(self, key: tuple[str, int], cached: bool = False) -> tuple[int, int]:
        if not cached and super().watermarks(key, cached=True)[1] >= 0:
            self.round_trips.append(key)
        return super().watermarks(key, cached)


def test_until_caught_up_reads_cached_watermarks(bootstrap, new_topic, kafka,
                                                 unique_name) -> None:
    """Run to the end of two partitions: the loop processes everything, commits the
    end, and its caught-up checks (after each short batch) ask the broker nothing once
    a fetch response brought a partition's watermarks."""
    source, output = new_topic("in", partitions=2), new_topic("out", partitions=2)
    for partition in (0, 1):
        kafka.produce(source, [b"p%d-%d" % (partition, i) for i in range(250)], partition)
    cfg = config(bootstrap, unique_name("caught-up"), source)
    consumer = CountingConsumer(cfg)
    run(cfg, Forward(output), KafkaClients(consumer, OutputProducer(cfg)))
    assert kafka.committed(cfg.name, source, 2) == {0: 250, 1: 250}
    assert len(kafka.read_all(output)) == 500
    assert consumer.round_trips == []


def test_default_consumer_settings_keep_the_prefetch_full_within_a_stated_bound() -> None:
    """The consumer refetches 10 ms after its queue drains below the threshold (not
    librdkafka's 1 s), holds at least a batch per partition, and stays within 64 MiB of
    prefetched records; every key can still be overridden."""
    conf: dict[str, Any] = Config(name="p", bootstrap_servers="b", input_topics=["t"],
                                  batch_size=200_000).to_consumer_conf()
    assert conf["fetch.queue.backoff.ms"] == 10
    assert conf["queued.min.messages"] == 200_000
    assert conf["queued.max.messages.kbytes"] == 65_536
    tuned = Config(name="p", bootstrap_servers="b", input_topics=["t"],
                   consumer_overrides={"fetch.queue.backoff.ms": 100,
                                       "queued.max.messages.kbytes": 16_384})
    assert tuned.to_consumer_conf()["fetch.queue.backoff.ms"] == 100
    assert tuned.to_consumer_conf()["queued.max.messages.kbytes"] == 16_384


def test_a_batch_sent_at_once_lands_where_the_java_client_puts_each_key(
        bootstrap, new_topic, kafka, unique_name) -> None:
    """``send_many`` leaves partitioning to the producer, as ``send`` does: on the real
    broker each record lands on murmur2(key) % partitions (the Java client's choice,
    what kasper_py's own murmur2 computes), with its timestamp (given, or inherited)
    and headers, each key's records in the order sent."""
    topic = new_topic("many", partitions=4)
    inherited = int(time.time() - 3600) * 1000  # within the broker's retention: kept
    given = inherited - 600_000
    sender = Sender(STRING, JSON)
    sender.timestamp = inherited
    sender.send_many(topic, [(f"key-{i % 37}", i, None if i % 3 else given + i,
                              {"i": str(i)} if i % 5 == 0 else None) for i in range(300)])
    producer = OutputProducer(Config(name=unique_name("many"), bootstrap_servers=bootstrap,
                                     input_topics=[topic]))
    try:
        producer.produce(sender.drain())
        producer.wait_for_acks()
    finally:
        producer.close()
    read = kafka.read_all(topic)
    assert len(read) == 300
    by_key: dict[bytes, list[int]] = {}
    for m in read:
        i = json.loads(m.value())
        key = f"key-{i % 37}".encode()
        assert m.key() == key
        assert m.partition() == murmur2_partition(key, 4)
        assert m.timestamp()[1] == (given + i if i % 3 == 0 else inherited)
        assert (m.headers() or []) == ([("i", str(i).encode())] if i % 5 == 0 else [])
        by_key.setdefault(key, []).append(i)
    assert all(sent == sorted(sent) for sent in by_key.values())
