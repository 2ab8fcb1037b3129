"""OutputProducer without a broker: how a turn's messages become produce calls, and
that every topic-partition receives its messages in the order process() sent them."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from kasper_py import Config, ProduceError
from kasper_py.kafka.producer import OutputProducer
from kasper_py.message import OutgoingMessage


class RecordingProducer:
    """Stands in for confluent_kafka.Producer: records the enqueue calls in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def produce(self, topic: str, value: bytes | None, key: bytes | None, partition: int,
                *later: Any) -> None:
        """confluent-kafka's order: ... partition, on_delivery, callback, timestamp, headers."""
        _on_delivery, _callback, timestamp, *headers = later
        self.calls.append((topic, value, key, partition, timestamp, *headers))

    def poll(self, timeout: float) -> int:
        return 0


def enqueue(messages: list[OutgoingMessage],
            recorder: RecordingProducer | None = None) -> list[tuple[Any, ...]]:
    producer = OutputProducer(Config(name="p", bootstrap_servers="127.0.0.1:1",
                                     input_topics=["in"]))
    recorder = recorder or RecordingProducer()
    producer._producer = recorder  # the real client stays unused: nothing is sent
    producer.produce([m.record() for m in messages])
    return recorder.calls


def test_messages_are_enqueued_in_send_order_with_their_headers() -> None:
    """Keyed v1, v2 with headers, v3 to partition 3: three calls in that order; no
    partition means librdkafka's "unassigned" (-1), so the partitioner hashes the key;
    no timestamp is librdkafka's 0, "now"."""
    calls = enqueue([OutgoingMessage("out", b"v1", b"K"),
                     OutgoingMessage("out", b"v2", b"K", None, (("h", b"1"),)),
                     OutgoingMessage("other", b"v3", None, 3)])
    assert calls == [("out", b"v1", b"K", -1, 0),
                     ("out", b"v2", b"K", -1, 0, [("h", b"1")]),
                     ("other", b"v3", None, 3, 0)]


def test_timestamps_are_passed_as_the_create_time() -> None:
    """A message's timestamp reaches produce() as its timestamp argument, with headers
    or without."""
    calls = enqueue([OutgoingMessage("out", b"v1", None, None, None, 1_700_000_000_123),
                     OutgoingMessage("out", b"v2", None, None, (("h", b"1"),), 42)])
    assert calls == [("out", b"v1", None, -1, 1_700_000_000_123),
                     ("out", b"v2", None, -1, 42, [("h", b"1")])]


class FullAt(RecordingProducer):
    """The local queue is full at the ``full_at``-th calls, as librdkafka's is while
    acks are slow: such a call raises BufferError and enqueues nothing."""

    def __init__(self, *full_at: int) -> None:
        super().__init__()
        self.full_at, self.attempts, self.polls = set(full_at), 0, 0

    def produce(self, topic: str, value: bytes | None, key: bytes | None, partition: int,
                *later: Any) -> None:
        self.attempts += 1
        if self.attempts in self.full_at:
            raise BufferError("Local: Queue full")
        super().produce(topic, value, key, partition, *later)

    def poll(self, timeout: float) -> int:
        self.polls += 1
        return 0


def test_a_full_queue_is_waited_out_and_the_refused_message_sent_once_in_order() -> None:
    """Queue full at the third message: the producer serves acks (poll) and goes on
    from that message, so every message is enqueued exactly once and in order."""
    recorder = FullAt(3)
    messages = [OutgoingMessage("out", b"%d" % i, None, 0) for i in range(5)]
    calls = enqueue(messages, recorder)
    assert [c[1] for c in calls] == [b"0", b"1", b"2", b"3", b"4"]
    assert recorder.polls == 1


def test_a_message_refused_again_and_again_is_still_sent_once_in_order() -> None:
    """The queue refuses the first message twice, then the last: each refused message
    is tried again until it is enqueued, none is lost or sent twice."""
    recorder = FullAt(1, 2, 6)
    messages = [OutgoingMessage("out", b"%d" % i, None, 0) for i in range(4)]
    calls = enqueue(messages, recorder)
    assert [c[1] for c in calls] == [b"0", b"1", b"2", b"3"]
    assert recorder.polls == 3


class RefusesTopic(RecordingProducer):
    """produce() raises KafkaException for one topic, as the client does for a topic it
    refuses at once (say an unknown partition)."""

    def produce(self, topic: str, value: bytes | None, key: bytes | None, partition: int,
                *later: Any) -> None:
        if topic == "refused":
            raise KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION))
        super().produce(topic, value, key, partition, *later)


def test_a_refused_produce_names_the_topic_of_the_message_it_refused() -> None:
    """Messages to three topics, the second refused: the messages before it are
    enqueued, none after it, and ``ProduceError`` names the refused message's topic
    (not the first's nor the last's) with the client's code."""
    recorder = RefusesTopic()
    messages = [OutgoingMessage("first", b"1"), OutgoingMessage("refused", b"2"),
                OutgoingMessage("last", b"3")]
    with pytest.raises(ProduceError, match="cannot produce to 'refused'") as info:
        enqueue(messages, recorder)
    assert info.value.code == KafkaError._UNKNOWN_PARTITION
    assert [c[0] for c in recorder.calls] == ["first"]


def test_a_full_queue_late_in_a_long_batch_sends_every_message_once_in_order() -> None:
    """A 10,000-message batch refused at its 7,000th and 9,999th calls: each is produced
    once, in order, after serving acks each time."""
    recorder = FullAt(7_000, 9_999)
    calls = enqueue([OutgoingMessage("out", b"%d" % i) for i in range(10_000)], recorder)
    assert [c[1] for c in calls] == [b"%d" % i for i in range(10_000)]
    assert recorder.polls == 2


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
    """produce() refuses every message with BufferError, as librdkafka does when the
    local queue never drains (a broker that stopped answering)."""

    def produce(self, topic: str, value: bytes | None, key: bytes | None, partition: int,
                *later: Any) -> None:
        raise BufferError("Local: Queue full")


def test_a_queue_that_stays_full_fails_the_turn_within_delivery_timeout() -> None:
    """Retrying a full queue gives up after delivery_timeout with ProduceError naming
    the topic, instead of retrying forever."""
    producer = OutputProducer(Config(name="p", bootstrap_servers="127.0.0.1:1",
                                     input_topics=["in"], delivery_timeout=0.3))
    producer._producer = AlwaysFull()
    with pytest.raises(ProduceError, match="producer queue stayed full for 'out'") as info:
        producer.produce([OutgoingMessage("out", b"v").record()])
    assert info.value.code == KafkaError._QUEUE_FULL


def test_a_failed_delivery_fails_the_wait_for_acks_that_follows() -> None:
    """librdkafka reports only failures (delivery.report.only.error) to the client's
    one callback; the next wait_for_acks raises the first, naming where it went."""
    config = Config(name="p", bootstrap_servers="127.0.0.1:1", input_topics=["in"])
    assert config.to_producer_conf()["delivery.report.only.error"] is True
    producer = OutputProducer(config)
    producer._producer = SlowAcks([0, 0])

    class Failed:
        def topic(self) -> str:
            return "out"

        def partition(self) -> int:
            return 2

    producer._on_delivery(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), Failed())
    with pytest.raises(ProduceError, match=r"delivery to out\[2\] failed") as info:
        producer.wait_for_acks()
    assert info.value.code == KafkaError.MSG_SIZE_TOO_LARGE
    producer.wait_for_acks()  # reported once: the next turn starts clean
