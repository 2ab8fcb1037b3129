"""The turn's fixed-cost shortcuts keep its behaviour: timers scheduled after the first
turns still fire, a turn's ``kasper.batch`` lines are logged (and captured) one per
partition unless the level filters them, a promotion waiting is still served, and every
timed step reports its seconds."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import structlog
from structlog.testing import capture_logs

from kasper_py import Config, Message, MessageProcessor, ProcessorContext, Sender, TopicProcessor
from kasper_py.observability.observe import NoopObserver, TurnStats
from kasper_py.sender import Sender as _Sender
from kasper_py.testing import InMemoryBroker, ProcessorDriver, make_message


class LateTimers(MessageProcessor):
    """Echoes each message; schedules its timers only at its second batch."""

    def __init__(self, context: ProcessorContext) -> None:
        self.context, self.batches = context, 0

    def process(self, messages: list[Message], sender: Sender) -> None:
        self.batches += 1
        if self.batches == 2:
            self.context.schedule(10, self.tick("stream"))
            self.context.schedule(10, self.tick("wall"), kind="wall_clock")
        for m in messages:
            sender.send("out", m.value)

    @staticmethod
    def tick(kind: str):  # type: ignore[no-untyped-def]
        def fire(now: int, sender: _Sender) -> None:
            sender.send("ticks", f"{kind} {now}")
        return fire


def driver() -> ProcessorDriver:
    return ProcessorDriver(LateTimers, value_serde="str", wall_clock_start=1_000.0)


def test_a_stream_time_timer_scheduled_in_a_later_turn_fires_in_that_turn() -> None:
    """No timer at first: the turn fires none; one scheduled while the second batch is
    processed fires right after it (aligned to the epoch, due at the first record), then
    when stream time passes its next due time."""
    d = driver()
    first = d.process([make_message("input", "a", timestamp=5_000)])
    assert [m.topic for m in first] == ["out"]
    second = d.process([make_message("input", "b", timestamp=6_000)])
    assert [(m.topic, m.value) for m in second] == [("out", b"b"), ("ticks", b"stream 6000")]
    assert d.advance_stream_time(9_999) == []
    late = d.advance_stream_time(10_000)
    assert [(m.topic, m.value) for m in late] == [("ticks", b"stream 10000")]


def test_a_wall_clock_timer_scheduled_in_a_later_turn_fires() -> None:
    """A wall-clock timer scheduled in a later turn is due 10 s after, and fires then."""
    d = driver()
    d.process([make_message("input", "a", timestamp=5_000)])
    d.process([make_message("input", "b", timestamp=6_000)])
    assert d.advance_wall_clock(9.999) == []
    fired = d.advance_wall_clock(0.001)
    assert [(m.topic, m.value) for m in fired] == [("ticks", b"wall 1010000")]


class Upper(MessageProcessor):
    def process(self, messages: list[Message], sender: Sender) -> None:
        for m in messages:
            sender.send("out", m.value.upper(), key=m.key)


class Turns(NoopObserver):
    def __init__(self) -> None:
        self.stats: list[TurnStats] = []

    def on_turn(self, stats: TurnStats) -> None:
        self.stats.append(stats)


def run_once(broker: InMemoryBroker, observer: Turns) -> None:
    config = Config(name="fixed-cost", bootstrap_servers="in-memory", input_topics=["in"],
                    key_serde="str", value_serde="str")
    with TopicProcessor(config, lambda _c: Upper(), clients=broker.clients(config),
                        observer=observer) as loop:
        loop.run_loop(until_caught_up=True)


@pytest.fixture
def broker() -> Iterator[InMemoryBroker]:
    broker = InMemoryBroker()
    broker.create_topic("in", partitions=3)
    broker.create_topic("out", partitions=3)
    for n in range(6):
        broker.produce("in", f"w{n}", partition=n % 3)
    yield broker
    structlog.reset_defaults()


def test_a_turn_logs_one_batch_line_per_partition_and_capture_logs_sees_them(
        broker: InMemoryBroker) -> None:
    """The turn's logger is bound once, yet ``capture_logs`` (configured after import)
    still sees a ``kasper.batch`` line per partition, with its offsets and timings."""
    observer = Turns()
    with capture_logs() as logs:
        run_once(broker, observer)
    lines = [e for e in logs if e["event"] == "kasper.batch"]
    assert sorted((e["partition"], e["first_offset"], e["last_offset"], e["consumed"])
                  for e in lines) == [(0, 0, 1, 2), (1, 0, 1, 2), (2, 0, 1, 2)]
    assert all(e["process_ms"] >= 0 and e["commit_ms"] >= 0 for e in lines)
    assert sum(len(s.batch) for s in observer.stats) == 6


def test_a_filtered_level_logs_no_batch_line_and_the_observer_still_hears_the_turn(
        broker: InMemoryBroker) -> None:
    """Below WARNING filtered out, no ``kasper.batch`` line is made; the observer gets
    every turn, with every timed step, and the offsets are committed."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
                        processors=[_fail_on_info])
    observer = Turns()
    run_once(broker, observer)
    assert sum(len(s.batch) for s in observer.stats) == 6
    assert all({"process", "flush", "produce", "read_ahead", "commit"} <= set(s.durations)
               for s in observer.stats if s.batch.ranges)
    assert all(v >= 0 for s in observer.stats for v in s.durations.values())
    assert broker.committed("fixed-cost") == {("in", p): 2 for p in range(3)}
    assert sorted(m.value for m in broker.read("out")) == [f"W{n}".encode() for n in range(6)]


def _fail_on_info(_logger: object, method: str, event: dict[str, object]) -> str:
    raise AssertionError(f"a filtered line was made: {method} {event}")
