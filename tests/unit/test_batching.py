"""Batching: release at batch_size or batch_wait, grouping by partition across topics,
decoding with context (in the same pass as reading, with the same result as decoding
what was read), and offsets that must only go forward."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
from confluent_kafka import KafkaError
from confluent_kafka import Message as RawMessage
from hypothesis import given, settings
from hypothesis import strategies as st

from kasper_py import BYTES, JSON, STRING, ConsumeError, OffsetError, SerdeError
from kasper_py.kafka.batching import Collector, build_batch, decode_batch
from kasper_py.kafka.offsets import OffsetTracker
from kasper_py.kafka.sizing import SampledBytes
from kasper_py.message import TIMESTAMP_CREATE_TIME, Message


def raw(topic: str, partition: int, offset: int, value: bytes = b"v",
        timestamp: int = 1000) -> RawMessage:
    return RawMessage(topic=topic, partition=partition, offset=offset, key=None, value=value,
                      timestamp=(1, timestamp))


class FakeClock:
    """A clock the consume stand-in advances, so waits are deterministic."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def idle_consume(clock: FakeClock, waits: list[float]
                 ) -> Callable[[int, float], Sequence[int]]:
    """A consume stand-in that nothing arrives at: it keeps each wait and lets it pass."""

    def consume(max_count: int, timeout: float) -> Sequence[int]:
        waits.append(timeout)
        clock.now += timeout
        return []

    return consume


def test_collect_releases_at_batch_size() -> None:
    """With records always available, a batch holds exactly batch_size records."""
    clock = FakeClock()
    calls: list[tuple[int, float]] = []

    def consume(max_count: int, timeout: float) -> Sequence[int]:
        calls.append((max_count, timeout))
        return list(range(min(max_count, 3)))

    collector = Collector(consume, 10, 5.0, clock)
    assert collector.gather()
    assert len(collector.take()) == 10
    assert [c[0] for c in calls] == [10, 7, 4, 1]


def test_collect_releases_at_batch_wait() -> None:
    """When records trickle in, the batch is released once batch_wait has passed."""
    clock = FakeClock()

    def consume(max_count: int, timeout: float) -> Sequence[int]:
        clock.now += min(timeout, 0.4)
        return [1]

    collector = Collector(consume, 1000, 1.0, clock)
    assert collector.gather()
    records = collector.take()
    assert len(records) == 3  # polls end at 0.4, 0.8 and 1.0 seconds
    assert clock.now == pytest.approx(1.0)


def test_gathering_ahead_stops_when_told_and_the_batch_wait_runs_from_its_first_consume(
) -> None:
    """Gathering while acks are outstanding stops as soon as ``until()`` is true, each
    consume waiting at most ``step``; finishing the batch later waits only what is left
    of batch_wait, counted from the first consume; the next batch starts afresh."""
    clock = FakeClock()
    waits: list[float] = []
    consume = idle_consume(clock, waits)
    collector = Collector(consume, 10, 1.0, clock)
    acks_due = iter([False, False, True])
    assert not collector.gather(until=lambda: next(acks_due), step=0.01)
    assert waits == [0.01, 0.01]
    assert collector.gather()  # the rest of batch_wait, then released empty
    assert waits[2:] == [pytest.approx(0.98)] and clock.now == pytest.approx(1.0)
    assert collector.take() == []
    assert collector.gather(until=lambda: True) is False
    assert len(waits) == 3  # told to stop before consuming: nothing waited


def test_gathering_ahead_never_asks_for_a_wait_under_the_clients_millisecond() -> None:
    """A read-ahead step under a millisecond (``max_latency`` below 0.05 made it so)
    is waited as one millisecond: librdkafka returns a shorter consume at once, and
    the loop spun (187,448 consumes in a 5 s run at 1,000 msg/s, measured with
    ``max_latency=0.025``; the loop thread's CPU 3-7x the default's)."""
    clock = FakeClock()
    waits: list[float] = []
    consume = idle_consume(clock, waits)
    collector = Collector(consume, 10, 0.1, clock, linger=0.005)
    assert collector.gather(until=lambda: False, step=0.0005)
    assert min(waits) >= 0.001
    assert len(waits) <= 100 and clock.now == pytest.approx(0.1, abs=0.001)


def test_gathering_ahead_reports_a_full_batch() -> None:
    """Records arriving faster than the acks: the batch fills while they are awaited."""
    collector = Collector(lambda n, _t: list(range(min(n, 4))), 10, 1.0, FakeClock())
    assert collector.gather(until=lambda: False, step=0.01)
    assert len(collector.take()) == 10


def test_collect_releases_at_max_bytes_asking_for_what_the_bytes_left_hold() -> None:
    """With ``weigh``, a batch is also full once its records' keys and values reach
    ``max_bytes``: after the first consume each asks for what the bytes left hold at
    the bytes per record so far (one at least), and no other follows."""
    clock = FakeClock()
    calls: list[int] = []

    def consume(max_count: int, timeout: float) -> list[RawMessage]:
        calls.append(max_count)
        return [raw("t", 0, n, value=b"x" * 1000) for n in range(min(max_count, 3))]

    collector = Collector(consume, 1000, 1.0, clock, weigh=SampledBytes())
    collector.max_bytes = 5_500
    assert collector.gather()
    assert collector.full and collector.bytes == 6_000
    assert len(collector.take()) == 6 and calls == [1000, 2, 1]
    assert collector.bytes == 0  # the next batch starts unweighed


def test_sampled_bytes_weighs_keys_and_values_from_every_eighth_record() -> None:
    """Uniform records are weighed exactly from their sample, however few; missing keys
    and values (tombstones) weigh nothing."""
    weigh = SampledBytes()
    records = [RawMessage(topic="t", partition=0, offset=n, key=b"k" * 10, value=b"v" * 100)
               for n in range(80)]
    assert [weigh(records) for _ in range(8)] == [80 * 110] * 8
    assert weigh(records[:1]) == 110
    assert weigh([RawMessage(topic="t", key=None, value=None)] * 9) == 0
    assert weigh([]) == 0


def test_sampled_bytes_does_not_miss_sizes_that_repeat_with_the_sample() -> None:
    """One large record in every eight: each call's sample starts one further, so eight
    calls weigh every record once, and their mean is the true size."""
    weigh = SampledBytes()
    mixed = [raw("t", 0, n, value=b"v" * (8000 if n % 8 == 1 else 100)) for n in range(64)]
    estimates = [weigh(mixed) for _ in range(8)]
    assert sum(estimates) == 8 * (8 * 8000 + 56 * 100)
    assert max(estimates) == 64 * 8000  # the call whose sample holds the large ones


def test_build_batch_groups_partitions_across_topics() -> None:
    """Messages of partition p from every input topic reach one list, topic by topic,
    each topic in offset order."""
    records = [raw("tweets", 0, 5), raw("followers", 0, 1), raw("tweets", 1, 9),
               raw("tweets", 0, 6, timestamp=2000)]
    batch = build_batch(records, BYTES, BYTES)
    assert [(m.topic, m.offset) for m in batch.by_partition[0]] == [
        ("tweets", 5), ("tweets", 6), ("followers", 1)]
    assert [m.offset for m in batch.by_partition[1]] == [9]
    assert batch.next_offsets() == {("tweets", 0): 7, ("followers", 0): 2, ("tweets", 1): 10}
    assert batch.ranges[("tweets", 0)].last_timestamp == 2000
    assert len(batch) == 4
    assert batch.describe(0) == "followers[0] offsets 1..1, tweets[0] offsets 5..6"


def test_build_batch_of_one_input_topic_groups_runs_and_keeps_the_topic() -> None:
    """With ``only_topic`` (the loop reads one topic) records are grouped per partition
    as without it, interleaved runs included, and every message carries that topic."""
    records = [raw("tweets", 0, 5), raw("tweets", 1, 9), raw("tweets", 0, 6),
               raw("tweets", 1, 10), raw("tweets", 0, 7)]
    batch = build_batch(records, BYTES, BYTES, only_topic="tweets")
    assert [(m.topic, m.offset) for m in batch.by_partition[0]] == [
        ("tweets", 5), ("tweets", 6), ("tweets", 7)]
    assert [(m.topic, m.offset) for m in batch.by_partition[1]] == [("tweets", 9), ("tweets", 10)]
    assert batch.next_offsets() == {("tweets", 0): 8, ("tweets", 1): 11}
    assert batch.by_partition == build_batch(records, BYTES, BYTES).by_partition


def test_decode_batch_groups_and_decodes_as_build_batch_does() -> None:
    """The runners' decoder (messages already read) and the loop's (raw records) give the
    same batch: grouped per partition across topics, decoded, and the bad one named."""
    records = [raw("tweets", 0, 5, b"1"), raw("followers", 0, 1, b"2"), raw("tweets", 1, 9, b"3"),
               raw("tweets", 0, 6, b"4")]
    read = [Message(r.topic(), r.partition(), r.offset(), r.key(), r.value(), 1000, (),
                    TIMESTAMP_CREATE_TIME) for r in records]
    from_records = build_batch(records, BYTES, JSON)
    from_messages = decode_batch(read, BYTES, JSON)
    assert from_messages.by_partition == from_records.by_partition
    assert [m.value for m in from_messages.by_partition[0]] == [1, 4, 2]
    assert from_messages.ranges == from_records.ranges
    with pytest.raises(SerdeError, match=r"followers\[0\] offset 1"):
        decode_batch([read[0], read[1]._replace(value=b"{")], BYTES, JSON)


def test_build_batch_decodes_and_names_the_bad_record() -> None:
    """A value that does not decode raises SerdeError naming topic, partition and offset."""
    batch = build_batch([raw("t", 0, 1, b'{"a":1}')], BYTES, JSON)
    assert batch.by_partition[0][0].value == {"a": 1}
    with pytest.raises(SerdeError, match=r"t\[0\] offset 2"):
        build_batch([raw("t", 0, 1, b"{}"), raw("t", 0, 2, b"{oops")], BYTES, JSON)


def test_build_batch_raises_on_record_errors() -> None:
    """A record carrying a Kafka error stops the batch with ConsumeError and its code."""
    bad = RawMessage(topic="t", partition=0, offset=-1,
                     error=KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    with pytest.raises(ConsumeError) as info:
        build_batch([bad], BYTES, BYTES)
    assert info.value.code == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert "t[0]" in str(info.value)


def test_transient_consumer_errors_are_retried_not_raised() -> None:
    """A moved group coordinator (seen on a fresh broker) is left to librdkafka and the
    batch goes on with the messages around it; an authorization error still stops it."""
    from kasper_py import Config
    from kasper_py.kafka.consumer import InputConsumer

    consumer = InputConsumer(Config(name="n", bootstrap_servers="127.0.0.1:1",
                                    input_topics=["t"]))
    try:
        busy = RawMessage(topic=None, partition=0, offset=-1,
                          error=KafkaError(KafkaError.NOT_COORDINATOR))
        batch = build_batch([raw("t", 0, 4), busy, raw("t", 0, 5)], BYTES, BYTES,
                            consumer.transient_error)
        assert [m.offset for m in batch.by_partition[0]] == [4, 5]
        assert batch.next_offsets() == {("t", 0): 6}
        denied = RawMessage(topic="t", partition=0, offset=-1,
                            error=KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
        with pytest.raises(ConsumeError, match=r"consuming t\[0\] failed"):
            build_batch([raw("t", 0, 4), denied], BYTES, BYTES, consumer.transient_error)
    finally:
        consumer.close()


def test_offsets_going_backwards_are_refused() -> None:
    """Within a batch, and against what was committed, offsets only move forward."""
    with pytest.raises(OffsetError, match="not increasing"):
        build_batch([raw("t", 0, 5), raw("t", 0, 5)], BYTES, BYTES)
    tracker = OffsetTracker()
    tracker.check({("t", 0): 10})
    tracker.mark_committed({("t", 0): 10})
    tracker.check({("t", 0): 10})
    with pytest.raises(OffsetError, match=r"t\[0\] offset 9: 10 was already committed"):
        tracker.check({("t", 0): 9})
    assert tracker.committed("t", 0) == 10


def test_dropping_revoked_partitions_mid_gather_keeps_what_comes_after() -> None:
    """A rebalance callback runs inside ``consume``, in the middle of ``gather``: the
    revoked partitions' records go, and records consumed after it still reach the batch
    (the list is filtered in place, not replaced under ``gather``)."""
    collector: Collector
    calls = iter([[raw("t", 1, 0)], "revoke", [raw("t", 0, 0), raw("t", 0, 1)]])

    def consume(_count: int, _timeout: float) -> list[RawMessage]:
        step = next(calls)
        if step == "revoke":
            collector.drop({("t", 1)})
            return []
        return list(step)

    collector = Collector(consume, batch_size=2, batch_wait=10.0, clock=lambda: 0.0)
    assert collector.gather()
    assert [(r.partition(), r.offset()) for r in collector.take()] == [(0, 0), (0, 1)]


def _record(row: tuple[Any, ...], offset: int) -> RawMessage:
    """A record of a generated row ``(topic, partition, key, value, stamped, headers)``."""
    topic, partition, key, value, stamped, headers = row
    return RawMessage(topic=topic, partition=partition, offset=offset, key=key, value=value,
                      timestamp=(1, 1000 + offset) if stamped else (0, -1), headers=headers)


class TopicTagged:
    """A topic serde (as a registry's): the value decodes to (topic, JSON value)."""

    name = "tagged"

    def for_topic(self, topic: str) -> object:
        class Bound:
            name = "tagged-bound"

            def encode(self, value: object) -> bytes | None:
                raise AssertionError("not encoding here")

            def decode(self, data: bytes | None) -> object:
                return (topic, JSON.decode(data))
        return Bound()

    def encode(self, value: object) -> bytes | None:
        raise AssertionError("bound per topic")

    def decode(self, data: bytes | None) -> object:
        raise AssertionError("bound per topic")


VALUES = [b"1", b'"w"', b'{"a":[1,2]}', None, b"{bad", b"-3", b"007"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 2),
                          st.sampled_from([b"k", b"\xff", None]), st.sampled_from(VALUES),
                          st.booleans(), st.sampled_from([None, [("h", b"1")]])),
                max_size=30),
       st.sampled_from([(STRING, JSON), (BYTES, JSON), (STRING, BYTES), (BYTES, TopicTagged())]))
def test_one_pass_decodes_as_decoding_what_was_read(rows: list[Any], serdes: Any) -> None:
    """Reading and decoding in one pass (the loop's path) gives the very batch the two
    passes give (records read as they are, then decoded: ``keep_read``, and
    ``decode_batch``): messages, ranges and the records set aside, whatever the mix of
    topics, partitions, keys and values that do or do not decode, timestamps, headers
    and topic serdes."""
    offsets: dict[tuple[str, int], int] = {}
    records = []
    for row in rows:
        offset = offsets[row[:2]] = offsets.get(row[:2], -1) + 1
        records.append(_record(row, offset))
    one = build_batch(records, *serdes, set_aside=True)
    two = build_batch(records, *serdes, set_aside=True, keep_read=True)
    read = [m for ms in build_batch(records, BYTES, BYTES).by_partition.values() for m in ms]
    three = decode_batch(read, *serdes, set_aside=True)
    for other in (two, three):
        assert one.by_partition == other.by_partition
        assert one.ranges == other.ranges
        assert sorted(one.undecodable) == sorted(other.undecodable)
    if one.undecodable:
        with pytest.raises(SerdeError, match="on_decode_error='fail'"):
            build_batch(records, *serdes)
    else:
        assert build_batch(records, *serdes).by_partition == one.by_partition


def test_a_transient_error_is_asked_about_once_when_a_record_does_not_decode() -> None:
    """Records are read once: a transient error in a batch that also sets a record aside
    is logged (asked about) once, not again for a second read of the batch."""
    asked: list[int] = []
    busy = RawMessage(topic=None, partition=0, offset=-1,
                      error=KafkaError(KafkaError.NOT_COORDINATOR))

    def transient(record: Any) -> bool:
        asked.append(1)
        return True

    batch = build_batch([raw("t", 0, 4, b"1"), busy, raw("t", 0, 5, b"{bad")], STRING, JSON,
                        transient, set_aside=True)
    assert asked == [1]
    assert [m.value for m in batch.by_partition[0]] == [1]
    assert [u.offset for u in batch.undecodable] == [5]
