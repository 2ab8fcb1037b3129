"""The loop's prefetcher (``kasper_py.loop.prefetch``) on ``InMemoryBroker``: batches of
``batch_size``, read ahead only while acks are outstanding, failures kept for the next
turn, revoked partitions dropped, and batch sizes from ``max_latency``. No server, no
sleeping."""

from __future__ import annotations

import dataclasses

import pytest

from kasper_py import Config, SerdeError
from kasper_py.kafka.batching import Batch
from kasper_py.kafka.ports import KafkaClients
from kasper_py.loop.prefetch import Prefetcher
from kasper_py.message import OutgoingMessage
from kasper_py.observability.observe import TurnStats
from kasper_py.testing import InMemoryBroker

CONFIG = Config(name="prefetch", bootstrap_servers="in-memory", input_topics=["in"],
                value_serde="str", batch_size=4, max_latency=None)  # classic batches


class Timers:
    """A schedule: a wall-clock timer due now, or none scheduled."""

    def __init__(self, due_now: bool = False) -> None:
        self.due_now = due_now

    def due(self) -> bool:
        return self.due_now

    def seconds_until_due(self) -> float | None:
        return 0.0 if self.due_now else None


NO_TIMERS = Timers()


def setup(records: int, config: Config = CONFIG, partitions: int = 1,
          values: list[bytes] | None = None) -> tuple[Prefetcher, KafkaClients]:
    broker = InMemoryBroker()
    broker.create_topic("in", partitions)
    broker.create_topic("out")
    for n, value in enumerate(values or [b"v%d" % n for n in range(records)]):
        broker.produce("in", value, partition=n % partitions)
    clients = broker.clients(config)
    clients.consumer.assign(list(range(partitions)))
    return Prefetcher(config, clients), clients


def offsets(batch: Batch) -> list[int]:
    return [m.offset for messages in batch.by_partition.values() for m in messages]


def hand_over_output(clients: KafkaClients) -> None:
    """A turn's output handed to the producer: its acks are outstanding."""
    clients.producer.produce([OutgoingMessage("out", b"o").record()])


def test_a_batch_takes_at_most_batch_size_records_decoded_in_order() -> None:
    prefetcher, _ = setup(10)
    first = prefetcher.next_batch(NO_TIMERS)
    assert offsets(first) == [0, 1, 2, 3]
    assert [m.value for m in first.by_partition[0]] == ["v0", "v1", "v2", "v3"]
    assert offsets(prefetcher.next_batch(NO_TIMERS)) == [4, 5, 6, 7]
    assert offsets(prefetcher.next_batch(NO_TIMERS)) == [8, 9]
    assert len(prefetcher.next_batch(NO_TIMERS)) == 0  # batch_wait over, nothing read


def test_the_next_batch_is_read_while_acks_are_outstanding() -> None:
    """Read ahead, the batch is held (not processed), and handed out as the next one."""
    prefetcher, clients = setup(10)
    prefetcher.next_batch(NO_TIMERS)
    hand_over_output(clients)

    prefetcher.read_ahead()

    assert prefetcher.holding()
    assert offsets(prefetcher.next_batch(NO_TIMERS)) == [4, 5, 6, 7]
    assert not prefetcher.holding()


def test_nothing_is_read_ahead_once_the_acks_are_in() -> None:
    prefetcher, _ = setup(10)
    prefetcher.next_batch(NO_TIMERS)
    prefetcher.read_ahead()
    assert not prefetcher.holding()


def test_a_batch_that_fails_to_decode_ahead_fails_its_own_turn() -> None:
    """The error of a batch read ahead is kept, not raised in the turn in hand: the
    next batch raises it."""
    values = [b"1", b"2", b"3", b"4", b"5", b"not json", b"7", b"8"]
    config = dataclasses.replace(CONFIG, value_serde="json")
    prefetcher, clients = setup(0, config, values=values)
    prefetcher.next_batch(NO_TIMERS)
    hand_over_output(clients)

    prefetcher.read_ahead()  # raises nothing

    with pytest.raises(SerdeError):
        prefetcher.next_batch(NO_TIMERS)


def test_a_due_timer_ends_the_gathering_at_once() -> None:
    """A wall-clock timer or task due now gets its turn first: the batch is empty and
    the records are read for the next one."""
    prefetcher, _ = setup(10)
    assert len(prefetcher.next_batch(Timers(due_now=True))) == 0
    assert offsets(prefetcher.next_batch(NO_TIMERS)) == [0, 1, 2, 3]


def test_records_gathered_of_revoked_partitions_are_dropped() -> None:
    """Partitions taken away mid-gather: what was read of them is forgotten (the new
    owner reads it from the committed offsets); the other partitions' records stay."""
    config = dataclasses.replace(CONFIG, batch_size=100)
    prefetcher, clients = setup(8, config, partitions=2)
    hand_over_output(clients)
    prefetcher.read_ahead()  # gathers, not full: nothing decoded yet
    assert prefetcher.holding()

    prefetcher.drop([("in", 1)])

    batch = prefetcher.next_batch(NO_TIMERS)
    assert list(batch.by_partition) == [0] and len(batch) == 4


def stats_of(batch: Batch, seconds: float, behind: int) -> TurnStats:
    tp = ("in", 0)
    return TurnStats(batch, 0, {"process": seconds}, committed={tp: 0},
                     high_watermarks={tp: behind})


def test_without_max_latency_every_batch_may_take_batch_size() -> None:
    prefetcher, _ = setup(10)
    stats = stats_of(prefetcher.next_batch(NO_TIMERS), 5.0, 1000)
    prefetcher.observe(stats)
    assert stats.batch_size_target == prefetcher.size == 4


def test_with_max_latency_a_backlog_grows_the_next_batch_up_to_batch_size() -> None:
    """The batch controller sizes the next batch from the last turn: records waiting
    behind the committed offsets (by the high watermarks) make it grow, to batch_size at
    most; the turn's stats report that size."""
    config = dataclasses.replace(CONFIG, batch_size=10_000, max_latency=0.05)
    prefetcher, _ = setup(10, config)
    assert prefetcher.size == 100  # the controller starts small
    stats = stats_of(prefetcher.next_batch(NO_TIMERS), 0.001, 1_000_000)

    prefetcher.observe(stats)

    assert stats.batch_size_target == prefetcher.size == 10_000
