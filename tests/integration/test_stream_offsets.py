"""The offsets a stream commits on transactional input: each transaction ends in a
commit marker that ``read_committed`` never returns, so the last record's offset + 1
stops one short of the partition's end; the stream commits the end Spark planned for
the micro-batch instead, and so catches up."""

from __future__ import annotations

from functools import partial

import pytest
import reprocess_processors as procs
from confluent_kafka import TopicPartition
from test_reprocess import config

from kasper_py.stream import stream
from tests.kafka_clients import Consumer, Producer

pytest_plugins = ["conftest_spark"]
pytestmark = [pytest.mark.integration, pytest.mark.spark]


def produce_in_transactions(bootstrap: str, topic: str, transactions: int, size: int) -> None:
    """``transactions`` committed transactions of ``size`` records on each of 2
    partitions, then one aborted transaction (its records and marker are skipped)."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic}"})
    producer.init_transactions(30)
    for t in range(transactions + 1):
        producer.begin_transaction()
        for n in range(size):
            for partition in range(2):
                producer.produce(topic, b"t%d-%d" % (t, n), partition=partition)
        if t < transactions:
            producer.commit_transaction(30)
        else:
            producer.flush(30)  # written, then aborted (unflushed records would be purged)
            producer.abort_transaction(30)


def high_watermarks(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "kasper-tests-highs"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(2)}
    finally:
        consumer.close()


def test_a_stream_over_transactional_input_catches_up(bootstrap, new_topic, kafka,  # noqa: PLR0917 - pytest fixtures
                                                      unique_name, spark, tmp_path) -> None:
    """3 committed transactions and an aborted one: the stream outputs the committed
    records once, and the group's offsets reach the partitions' ends (markers and
    aborted records included), so ``await_caught_up`` returns True and no lag is left."""
    source, output = new_topic("in", partitions=2), new_topic("out", partitions=2)
    produce_in_transactions(bootstrap, source, transactions=3, size=50)
    ends = high_watermarks(bootstrap, source)
    assert ends == {0: 50 * 4 + 4, 1: 50 * 4 + 4}  # 4 markers, the aborted 50 records
    cfg = config(bootstrap, unique_name("tx-stream"), [source])
    run = stream(cfg, partial(procs.Tagged, output=output), checkpoint=str(tmp_path / "cp"),
                 spark=spark, trigger=0.5)
    try:
        assert run.await_caught_up(timeout=120)
    finally:
        run.stop()
    assert kafka.committed(cfg.name, source, 2) == ends
    values = sorted(m.value().rsplit(b"|", 1)[1] for m in kafka.read_all(output))
    assert values == sorted(b"t%d-%d" % (t, n) for t in range(3) for n in range(50)
                            for _ in range(2))
