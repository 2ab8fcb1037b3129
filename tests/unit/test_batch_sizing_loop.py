"""Batch sizing in the real loop (``TopicProcessor``) on ``InMemoryBroker``, on a clock
the test controls: through a backlog batches grow past Kasper's 1,000 up to the caps
(records, bytes, a turn of ten targets), under paced input they stay small and linger
briefly, and classic batches (``max_latency=None``) are as they always were. The clock
moves only when the consumer waits (to the next arrival, or its timeout) or the
processor says it worked; nothing is timed for real."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import pytest
from structlog.testing import capture_logs

from kasper_py import Config, Message, MessageProcessor, Sender, TopicProcessor
from kasper_py.kafka.sizing import (
    BACKLOG_TURN,
    EXACTLY_ONCE_LOCALITY,
    LOCALITY_BYTES,
    RECORD_OVERHEAD,
)
from kasper_py.observability.observe import NoopObserver, TurnStats
from kasper_py.testing import InMemoryBroker

PARTITIONS = 2
TARGET = 0.05
LINGER = TARGET / 10
"""The longest a batch waits for more once its first record is in."""
STEP = TARGET / 50
"""The longest a consume waits while the loop reads ahead (so a batch's first record may
be read that long after it arrived)."""


class Clock:
    """Seconds on the test's clock."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Arrivals:
    """The in-memory consumer, fed by records that arrive at ``times`` on ``clock``
    (dealt round-robin over the partitions). A consume returns at once when enough has
    arrived; else, as librdkafka's does, it waits (the clock moves on) until enough has,
    or its timeout is over, and returns what there is."""

    def __init__(self, broker: InMemoryBroker, consumer: Any, clock: Clock,
                 times: Sequence[float], value: bytes) -> None:
        self._broker, self._consumer, self._clock = broker, consumer, clock
        self.times, self.value, self.arrived = list(times), value, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)

    def arrival(self, partition: int, offset: int) -> float:
        return self.times[offset * PARTITIONS + partition]

    def consume(self, max_count: int, timeout: float) -> list[Any]:
        deadline = self._clock.now + timeout
        self._arrive()
        records = self._consumer.consume(max_count, 0)
        while len(records) < max_count and self._clock.now < deadline:
            last = self.arrived + max_count - len(records) - 1
            enough_at = self.times[last] if last < len(self.times) else math.inf
            self._clock.now = min(deadline, max(self._clock.now, enough_at))
            self._arrive()
            records += self._consumer.consume(max_count - len(records), 0)
        return records

    def _arrive(self) -> None:
        while self.arrived < len(self.times) and self.times[self.arrived] <= self._clock.now:
            self._broker.produce("in", self.value, partition=self.arrived % PARTITIONS)
            self.arrived += 1


class Work(MessageProcessor):
    """Copies every message to ``out``, taking ``cost`` seconds a message on the clock."""

    def __init__(self, clock: Clock, cost: float) -> None:
        self.clock, self.cost = clock, cost

    def process(self, messages: list[Message], sender: Sender) -> None:
        self.clock.now += self.cost * len(messages)
        for m in messages:
            sender.send("out", m.value)


class Latest(Work):
    """Sends each batch's last value once per partition (records of one value): a
    count's coalescing, at its most."""

    def process(self, messages: list[Message], sender: Sender) -> None:
        self.clock.now += self.cost * len(messages)
        sender.send("out", messages[-1].value)


class Turns(NoopObserver):
    """Every turn's batch length, bytes and target, and each message's latency (its
    arrival to its turn's commit, on the clock); closes the loop once ``total`` are in."""

    def __init__(self, clock: Clock, arrivals: Arrivals, total: int) -> None:
        self.clock, self.arrivals, self.total = clock, arrivals, total
        self.lengths: list[int] = []
        self.bytes: list[int] = []
        self.targets: list[int | None] = []
        self.latencies: list[float] = []
        self.processor: TopicProcessor | None = None

    def on_turn(self, stats: TurnStats) -> None:
        messages = [m for ms in stats.batch.by_partition.values() for m in ms]
        self.lengths.append(len(messages))
        self.bytes.append(sum(len(m.value) for m in messages))
        self.targets.append(stats.batch_size_target)
        self.latencies += [self.clock.now - self.arrivals.arrival(m.partition, m.offset)
                           for m in messages]
        if sum(self.lengths) >= self.total and self.processor is not None:
            self.processor.close()


def run(times: Sequence[float], cost: float, value: bytes = b"v" * 100,
        work: type[Work] = Work, **settings: Any) -> tuple[Turns, InMemoryBroker]:
    """A copying loop (or another ``work``) over records arriving at ``times``, each
    costing ``cost`` seconds, with ``settings`` (else the defaults), until every record
    is committed."""
    broker, clock = InMemoryBroker(), Clock()
    broker.create_topic("in", partitions=PARTITIONS)
    broker.create_topic("out", partitions=PARTITIONS)
    config = Config(name="sizing", bootstrap_servers="in-memory", input_topics=["in"],
                    **settings)
    clients = broker.clients(config)
    arrivals = Arrivals(broker, clients.consumer, clock, times, value)
    observer = Turns(clock, arrivals, len(times))
    processor = TopicProcessor(config, lambda _c: work(clock, cost), observer=observer,
                               clients=dataclasses.replace(clients, consumer=arrivals,
                                                           clock=clock))
    observer.processor = processor
    processor.run_loop()
    if work is Work:
        assert len(broker.read("out")) == len(times)  # every record copied once
    assert broker.committed("sizing") == {("in", p): len(times) // PARTITIONS
                                          for p in range(PARTITIONS)}
    return observer, broker


# -- under a backlog ------------------------------------------------------------------

def test_a_backlog_grows_batches_past_kaspers_1000_to_the_largest_batch() -> None:
    """60,000 records waiting, at 1 µs a record, with the defaults: the first batch is
    the controller's smallest, the next jumps to what waits, held at 20,000 records
    (``Config.largest_batch``): far past the 1,000 of Kasper's classic batches."""
    turns, _ = run([0.0] * 60_000, cost=1e-6)
    assert turns.lengths[0] == 100
    assert max(turns.lengths) == 20_000 == Config(
        name="n", bootstrap_servers="b", input_topics=["t"]).largest_batch
    assert all(target is not None and 100 <= target <= 20_000 for target in turns.targets)
    assert len(turns.lengths) <= 5


def test_a_backlog_copied_one_for_one_settles_at_the_locality_bound() -> None:
    """200,000 records of 100 bytes, each copied: two batches of 20,000, two of what
    LOCALITY_BYTES holds, compared by their outputs per input (equal: nothing
    coalesces), and from then on batches of the bound, not 20,000."""
    with capture_logs() as logs:
        turns, _ = run([0.0] * 200_000, cost=1e-6)
    local = LOCALITY_BYTES // (100 + RECORD_OVERHEAD)
    assert turns.lengths[:3] == [100, 20_000, 20_000]
    assert set(turns.lengths[6:-1]) == {local}
    bounds = [e for e in logs if e["event"] == "kasper.batch_bound"]
    assert bounds == [{"event": "kasper.batch_bound", "log_level": "info",
                       "processor": "sizing", "batches": local, "bound": local,
                       "largest": 20_000, "outputs_per_input_largest": 1.0,
                       "outputs_per_input_bound": 1.0, "coalesces": False}]


def test_exactly_once_holds_twice_the_locality_bound() -> None:
    """Under exactly-once a turn carries a transaction's fixed cost, so the bound holds
    twice the memory: the same copied backlog settles at twice as many records."""
    turns, _ = run([0.0] * 200_000, cost=1e-6, processing_guarantee="exactly_once")
    local = EXACTLY_ONCE_LOCALITY * LOCALITY_BYTES // (100 + RECORD_OVERHEAD)
    assert local == 20_971  # past the largest batch (20,000): no probe
    assert set(turns.lengths[2:-1]) == {20_000}
    small, _ = run([0.0] * 60_000, cost=1e-6, processing_guarantee="exactly_once",
                   value=b"v" * 400)
    held = EXACTLY_ONCE_LOCALITY * LOCALITY_BYTES // (400 + RECORD_OVERHEAD)
    assert held in small.lengths


def test_a_backlog_that_coalesces_keeps_the_largest_batch() -> None:
    """The same backlog into a processor with one output a partition and batch: the
    batches of the bound send more outputs per input, so after them batches go back
    to 20,000 and stay there."""
    with capture_logs() as logs:
        turns, _ = run([0.0] * 200_000, cost=1e-6, work=Latest)
    local = LOCALITY_BYTES // (100 + RECORD_OVERHEAD)
    assert local in turns.lengths[3:6]
    assert set(turns.lengths[6:-1]) == {20_000}
    [bound] = [e for e in logs if e["event"] == "kasper.batch_bound"]
    assert bound["coalesces"] is True and bound["batches"] == 20_000
    assert bound["outputs_per_input_largest"] < bound["outputs_per_input_bound"]


def test_a_backlog_of_large_records_is_bounded_in_bytes() -> None:
    """2,000-byte records with batch_bytes of 1 MiB: once the first batch is weighed, no
    batch holds more than 1 MiB of values; they still grow well past the first."""
    turns, _ = run([0.0] * 6_000, cost=1e-6, value=b"v" * 2_000, batch_bytes=2**20)
    assert all(size <= 2**20 for size in turns.bytes)
    assert max(turns.lengths) == 2**20 // 2_000
    assert turns.lengths[0] == 100


def test_a_backlog_on_a_slow_processor_keeps_each_turn_within_ten_targets() -> None:
    """At 1 ms a record a turn of ten targets (0.5 s) holds 500: batches grow from the
    smallest to that, never past it, however much waits."""
    turns, _ = run([0.0] * 3_000, cost=1e-3)
    assert BACKLOG_TURN == 10
    assert turns.lengths[0] == 100
    assert 490 <= max(turns.lengths) <= 500
    assert all(length * 1e-3 <= BACKLOG_TURN * TARGET + 1e-9 for length in turns.lengths)


def test_a_backlog_with_batch_size_set_stops_there() -> None:
    """batch_size, when given, is the largest batch under a latency target too."""
    turns, _ = run([0.0] * 20_000, cost=1e-6, batch_size=5_000)
    assert turns.lengths[0] == 100 and max(turns.lengths) == 5_000


# -- under paced input ----------------------------------------------------------------

@pytest.mark.parametrize("rate", [1_000, 10_000])
def test_paced_input_keeps_batches_small_and_lingers_a_tenth_of_the_target(rate: int) -> None:
    """Records arriving steadily (2 s of them, 10 µs of work a record): a batch waits
    at most a tenth of the target (5 ms) once its first record is read, so it holds
    about what arrives in that time (and in a read-ahead step); the target stays within
    twice that (or the smallest batch), and no record waits longer than the linger, the
    step and two turns' work."""
    count = 2 * rate
    turns, _ = run([n / rate for n in range(count)], cost=10e-6)
    batch = rate * (LINGER + STEP) + 2
    assert max(turns.lengths) <= batch
    assert max(turns.latencies) <= LINGER + STEP + 2 * batch * 10e-6
    assert all(target is not None and target <= max(100, 2 * batch)
               for target in turns.targets)


def test_paced_input_after_a_backlog_returns_to_short_lingers() -> None:
    """A backlog of 30,000 then 10,000 records a second: batches grow through the
    backlog, then shrink back, and the records arriving after it wait as under paced
    input alone."""
    rate, backlog = 10_000, 30_000
    times = [0.0] * backlog + [0.5 + n / rate for n in range(10_000)]
    turns, _ = run(times, cost=2e-6)
    assert max(turns.lengths) >= backlog // 2
    paced = turns.latencies[-5_000:]  # the second half of the paced records
    assert max(paced) <= LINGER + STEP + 2 * rate * (LINGER + STEP) * 2e-6
    assert turns.targets[-1] is not None and turns.targets[-1] <= 1_000


# -- classic batches ------------------------------------------------------------------

def test_classic_batches_are_batch_size_or_batch_wait_as_before() -> None:
    """max_latency=None with batch_size unset: Kasper's batches of 1,000, each reported
    as its own target; a partial batch waits out batch_wait."""
    turns, _ = run([0.0] * 2_500, cost=1e-6, max_latency=None)
    assert turns.lengths == [1_000, 1_000, 500]
    assert turns.targets == [1_000, 1_000, 1_000]
    assert 1.0 <= max(turns.latencies) <= 1.01  # the last waits out batch_wait


def test_classic_batches_ignore_a_backlog_and_the_bytes() -> None:
    """Classic batches of batch_size never grow with a backlog, and batch_bytes does
    not apply to them."""
    turns, _ = run([0.0] * 3_000, cost=1e-6, value=b"v" * 2_000, max_latency=None,
                   batch_size=1_500, batch_bytes=2**20)
    assert turns.lengths == [1_500, 1_500]
