"""Co-partitioned inputs aligned by timestamp on the real broker: a backlog of table
records and of events, timestamps interleaved, with the table's partitions fetched only
after every event was read (the race of a real start, made certain). With the defaults
every event meets the table value current at its timestamp; with ``max_task_idle=None``
the events read first meet none."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from kasper_py import Config, Message, MessageProcessor, Sender, TopicProcessor
from kasper_py.kafka.alignment import consumer_lags
from kasper_py.kafka.consumer import InputConsumer
from kasper_py.kafka.ports import KafkaClients
from kasper_py.kafka.producer import OutputProducer
from tests.kafka_clients import Producer

PARTITIONS = 2
TABLE_VALUES = 20
EVENTS = 100
BASE = int(time.time() * 1000) - 3_600_000  # an hour ago: within any retention
TABLE_TIMES = [BASE + 1000 * i for i in range(TABLE_VALUES)]
EVENT_TIMES = [BASE + 100 + 200 * j for j in range(EVENTS)]


class Join(MessageProcessor):
    """Each event with the table value current at its timestamp: the batch's messages
    in timestamp order, table updates before events at equal timestamps."""

    table_value: str | None = None
    table_topic = ""
    output = ""

    def process(self, messages: list[Message], sender: Sender) -> None:
        for message in sorted(messages, key=lambda m: (m.timestamp,
                                                      m.topic != self.table_topic)):
            if message.topic == self.table_topic:
                self.table_value = message.value
            else:
                sender.send(self.output, f"{message.value}:{self.table_value}",
                            partition=message.partition)


class TableFetchedLast:
    """The real consumer, with the table's partitions paused (librdkafka fetches nothing
    of them) until every event has been read."""

    def __init__(self, consumer: InputConsumer, table: str, events: str) -> None:
        self._consumer, self._table, self._events = consumer, table, events
        self._events_read = 0
        self._paused = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)

    def consume(self, max_count: int, timeout: float) -> list[Any]:
        client = self._consumer._consumer
        table = [TopicPartition(self._table, p) for p in range(PARTITIONS)]
        if self._events_read < EVENTS * PARTITIONS and not self._paused:
            client.pause(table)
            self._paused = True
        elif self._events_read >= EVENTS * PARTITIONS and self._paused:
            client.resume(table)
            self._paused = False
        records = self._consumer.consume(max_count, timeout)
        self._events_read += sum(1 for r in records if r.topic() == self._events)
        return records


def expected(partition: int) -> list[str]:
    return [f"e{partition}-{j}:t{partition}-{(ts - BASE) // 1000}"
            for j, ts in enumerate(EVENT_TIMES)]


@pytest.mark.parametrize("max_task_idle", [0.0, None], ids=["default", "unaligned"])
def test_every_event_meets_the_table_value_current_at_its_timestamp(
        bootstrap: str, new_topic: Callable[..., str], kafka: Any,
        unique_name: Callable[[str], str], max_task_idle: float | None) -> None:
    """Aligned (the default), every event gets the table value of its time, exactly, and
    every offset ends committed; unaligned, the events read before the table get none."""
    table, events = new_topic("table", PARTITIONS), new_topic("events", PARTITIONS)
    output = new_topic("joined", PARTITIONS)
    for p in range(PARTITIONS):
        kafka.produce(table, [(b"k", f"t{p}-{i}", ts) for i, ts in enumerate(TABLE_TIMES)],
                      partition=p)
        kafka.produce(events, [(b"k", f"e{p}-{j}", ts) for j, ts in enumerate(EVENT_TIMES)],
                      partition=p)
    name = unique_name("align")
    config = Config(name=name, bootstrap_servers=bootstrap, input_topics=[table, events],
                    value_serde="str", max_task_idle=max_task_idle)
    join = type("TableJoin", (Join,), {"table_topic": table, "output": output})
    clients = KafkaClients(TableFetchedLast(InputConsumer(config), table, events),
                           OutputProducer(config))
    processor = TopicProcessor(config, join, clients=clients)  # type: ignore[arg-type]
    processor.run_loop(until_caught_up=True)
    processor.close()

    joined = kafka.read_all(output)
    for p in range(PARTITIONS):
        values = [m.value().decode() for m in joined if m.partition() == p]
        if max_task_idle is None:
            assert values[0] == f"e{p}-0:None"
            assert values != expected(p)
        else:
            assert values == expected(p)
    assert kafka.committed(name, table, PARTITIONS) == {0: TABLE_VALUES, 1: TABLE_VALUES}
    assert kafka.committed(name, events, PARTITIONS) == {0: EVENTS, 1: EVENTS}


def test_an_input_read_to_its_end_past_a_transaction_marker_is_caught_up(
        bootstrap: str, new_topic: Callable[..., str], unique_name: Callable[[str], str]) -> None:
    """Co-partitioned inputs, one written by a committed transaction: once its fetch
    reached the end, its position is past the commit marker, so it has no lag and never
    holds the other input back (a marker is no record to wait for)."""
    table, events = new_topic("eof-table"), new_topic("eof-events")
    producer = Producer({"bootstrap.servers": bootstrap,
                         "transactional.id": unique_name("align-tx")})
    producer.init_transactions()
    producer.begin_transaction()
    for _ in range(5):
        producer.produce(table, b"v", key=b"k")
    producer.commit_transaction()
    config = Config(name=unique_name("align-eof"), bootstrap_servers=bootstrap,
                    input_topics=[table, events])
    consumer = InputConsumer(config)
    lags = consumer_lags(consumer.positions, consumer.watermarks)
    keys = [(table, 0), (events, 0)]
    try:
        consumer.assign([0])
        read: list[Any] = []
        deadline = time.monotonic() + 30
        while lags(keys) != dict.fromkeys(keys, 0) and time.monotonic() < deadline:
            read += consumer.consume(100, 0.5)
        assert lags(keys) == {(table, 0): 0, (events, 0): 0}
        assert len(read) == 5  # the five records; the marker and end events are no records
        assert all(record.error() is None for record in read)
        assert consumer.positions()[(table, 0)] == 6  # past the marker at offset 5
    finally:
        consumer.close()


def test_a_held_back_partition_is_read_on_from_where_reading_stopped(
        bootstrap: str, new_topic: Callable[..., str], kafka: Any,
        unique_name: Callable[[str], str]) -> None:
    """``hold_back`` stops the fetch of one input partition (librdkafka drops what it
    fetched of it ahead); ``read_on`` fetches it again from after the last record read:
    every record comes once, in offset order. A partition the group paused stays paused
    through ``read_on``."""
    topic, other = new_topic("held"), new_topic("held-other")
    kafka.produce(topic, [(b"k", f"v{i}") for i in range(100)], partition=0)
    config = Config(name=unique_name("held"), bootstrap_servers=bootstrap,
                    input_topics=[topic, other])
    consumer, key = InputConsumer(config), (topic, 0)
    try:
        consumer.partition_count()
        consumer.assign([0])
        offsets = _offsets_read(consumer, lambda got: len(got) >= 10, count=10)
        consumer.hold_back([key])
        assert _offsets_read(consumer, lambda got: False, seconds=1.0) == []
        consumer.read_on([key])
        offsets += _offsets_read(consumer, lambda got: len(offsets) + len(got) >= 100)
        assert offsets == list(range(100))

        consumer.pause([key])
        consumer.hold_back([key])
        consumer.read_on([key])
        kafka.produce(topic, [(b"k", b"late")], partition=0)
        assert _offsets_read(consumer, lambda got: False, seconds=1.0) == []
    finally:
        consumer.close()


def _offsets_read(consumer: InputConsumer, enough: Callable[[list[int]], bool],
                  count: int = 100, seconds: float = 30.0) -> list[int]:
    """The offsets of the records ``consumer`` reads, at most ``count`` a consume, until
    ``enough`` of them or ``seconds`` are over."""
    got: list[int] = []
    deadline = time.monotonic() + seconds
    while not enough(got) and time.monotonic() < deadline:
        got += [r.offset() for r in consumer.consume(count, 0.2) if r.error() is None]
    return got
