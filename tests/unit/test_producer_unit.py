"""OutputProducer without a broker: how a turn's messages become produce calls, and
that every topic-partition receives its messages in the order process() sent them."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError

from kasper_py import Config, ProduceError
from kasper_py.message import OutgoingMessage
from kasper_py.producer import OutputProducer


class RecordingProducer:
    """Stands in for confluent_kafka.Producer: records the enqueue calls in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def produce_batch(self, topic: str, entries: list[dict[str, Any]], partition: int,
                      on_delivery: Any) -> int:
        self.calls.append(("batch", topic, partition, [e["value"] for e in entries]))
        return len(entries)

    def produce(self, topic: str, **kwargs: Any) -> None:
        self.calls.append(("one", topic, kwargs.get("partition", -1), [kwargs["value"]]))


def enqueue(messages: list[OutgoingMessage]) -> list[tuple[Any, ...]]:
    producer = OutputProducer(Config(name="p", bootstrap_servers="127.0.0.1:1",
                                     input_topics=["in"]))
    recorder = RecordingProducer()
    producer._producer = recorder  # the real client stays unused: nothing is sent
    producer.produce(messages)
    return recorder.calls


def test_a_message_with_headers_does_not_overtake_the_run_before_it() -> None:
    """Keyed v1, v2 with headers, keyed v3 for one topic: enqueued v1, v2, v3."""
    calls = enqueue([OutgoingMessage("out", b"v1", b"K"),
                     OutgoingMessage("out", b"v2", b"K", None, (("h", b"1"),)),
                     OutgoingMessage("out", b"v3", b"K")])
    assert calls == [("batch", "out", -1, [b"v1"]), ("one", "out", -1, [b"v2"]),
                     ("batch", "out", -1, [b"v3"])]


def test_explicit_and_keyed_partitions_keep_send_order() -> None:
    """b to partition 3, a keyed (which may hash to 3), c to partition 3: b, a, c."""
    calls = enqueue([OutgoingMessage("out", b"b", None, 3), OutgoingMessage("out", b"a", b"k"),
                     OutgoingMessage("out", b"c", None, 3)])
    assert [c[3] for c in calls] == [[b"b"], [b"a"], [b"c"]]


def test_runs_are_per_topic_so_interleaved_topics_stay_batched() -> None:
    """Alternating two topics costs one call per topic, each in its own send order."""
    messages = [OutgoingMessage(topic, b"%s%d" % (topic.encode(), i), b"k")
                for i in range(3) for topic in ("a", "b")]
    calls = enqueue(messages)
    assert calls == [("batch", "a", -1, [b"a0", b"a1", b"a2"]),
                     ("batch", "b", -1, [b"b0", b"b1", b"b2"])]


class SlowAcks(RecordingProducer):
    """flush() reports messages still queued for the first few calls."""

    def __init__(self, remaining: list[int]) -> None:
        super().__init__()
        self.remaining = remaining

    def flush(self, timeout: float) -> int:
        self.calls.append(("flush", timeout))
        return self.remaining.pop(0)


def test_a_long_ack_wait_keeps_telling_the_loop_it_is_alive() -> None:
    """While acks are outstanding the wait goes on in slices of at most a second,
    calling ``waiting`` between them; it ends once the queue is empty."""
    producer = OutputProducer(Config(name="p", bootstrap_servers="127.0.0.1:1",
                                     input_topics=["in"], delivery_timeout=30.0))
    producer._producer = SlowAcks([5, 2, 0])
    ticks: list[int] = []
    producer.wait_for_acks(lambda: ticks.append(1))
    assert len(ticks) == 2
    assert all(0 < call[1] <= 1.0 for call in producer._producer.calls)


class AlwaysFull(RecordingProducer):
    """produce_batch refuses every entry with QUEUE_FULL, as librdkafka does when the
    local queue never drains (a broker that stopped answering)."""

    def produce_batch(self, topic: str, entries: list[dict[str, Any]], partition: int,
                      on_delivery: Any) -> int:
        for entry in entries:
            entry["_error"] = KafkaError(KafkaError._QUEUE_FULL)
        return 0

    def poll(self, timeout: float) -> int:
        return 0


def test_a_queue_that_stays_full_fails_the_turn_within_delivery_timeout() -> None:
    """Retrying a full queue gives up after delivery_timeout with ProduceError naming
    the topic, instead of retrying forever."""
    producer = OutputProducer(Config(name="p", bootstrap_servers="127.0.0.1:1",
                                     input_topics=["in"], delivery_timeout=0.3))
    producer._producer = AlwaysFull()
    with pytest.raises(ProduceError, match="producer queue stayed full for 'out'") as info:
        producer.produce([OutgoingMessage("out", b"v")])
    assert info.value.code == KafkaError._QUEUE_FULL
