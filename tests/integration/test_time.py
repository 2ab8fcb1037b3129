"""Time on the real broker: a wall-clock timer's output appears and is committed with
no input; a timer's output is not committed when its turn fails (process() raises, a
delivery fails), with the committed offsets and the read_committed output checked; and
the timestamps the output carries: inherited, overridden, timer-fired, and the input's
timestamp type (create or log-append time)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME as KAFKA_CREATE_TIME

from kasper_py import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    Config,
    Message,
    MessageProcessor,
    ProcessingError,
    ProcessorContext,
    ProduceError,
    Sender,
    TopicProcessor,
)

sys.path.insert(0, str(Path(__file__).parent))
from test_topic_processor import config  # isort: skip

pytestmark = pytest.mark.integration
GUARANTEES = pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
INPUT_TIME = (int(time.time()) - 3600) * 1000
"""The create time of the test input: an hour before the test runs (within the stack
broker's 24 h retention, which counts from record timestamps and deletes older records
at its check every minute, input and output alike)."""
OVERRIDE = INPUT_TIME - 3_600_000


class Timed(MessageProcessor):
    """Forwards each value to ``out`` (raising on b"poison"); its timer sends the firing
    time to ``ticks`` (``big``: a value over that topic's limit) and closes the loop after
    ``stop_after`` firings."""

    def __init__(self, context: ProcessorContext, loop: list[TopicProcessor],
                 topics: tuple[str, str], *, kind: Any = "wall_clock", interval: float = 0.3,
                 stop_after: int | None = None, big: bool = False) -> None:
        self.loop, self.stop_after, self.big = loop, stop_after, big
        self.out, self.ticks = topics
        self.fired: list[int] = []
        context.schedule(interval, self.tick, kind)

    def process(self, messages: list[Message], sender: Sender) -> None:
        for message in messages:
            if message.value == b"poison":
                raise ValueError("poison")
            sender.send(self.out, message.value)

    def tick(self, timestamp: int, sender: Sender) -> None:
        self.fired.append(timestamp)
        value = b"x" * 2000 if self.big else str(timestamp).encode()
        sender.send(self.ticks, value, partition=0)
        if self.stop_after is not None and len(self.fired) >= self.stop_after:
            self.loop[0].close()  # from the loop's own thread: it stops after this turn


def build(cfg: Config, topics: tuple[str, str], **options: Any
          ) -> tuple[TopicProcessor, list[Timed]]:
    """The loop, and the processors it builds (one per partition)."""
    holder: list[TopicProcessor] = []
    built: list[Timed] = []

    def factory(context: ProcessorContext) -> Timed:
        built.append(Timed(context, holder, topics, **options))
        return built[-1]

    processor = TopicProcessor(cfg, factory)
    holder.append(processor)
    return processor, built


@GUARANTEES
def test_a_wall_clock_timer_commits_its_output_with_no_input(
        bootstrap, new_topic, kafka, unique_name, guarantee: str) -> None:
    """An empty input topic: the loop runs turns of its own for a 0.3 s wall-clock
    timer; its three ticks are readable by read_committed consumers, stamped with the
    time that fired them, and no input offset is committed."""
    source, out, ticks = new_topic("in"), new_topic("out"), new_topic("ticks")
    name = unique_name("idle-timer")
    processor, built = build(config(bootstrap, name, [source],
                                    processing_guarantee=guarantee), (out, ticks),
                             stop_after=3)
    started = int(time.time() * 1000)
    processor.run_loop()
    read = kafka.read_all(ticks)
    assert [int(m.value()) for m in read] == built[0].fired
    assert [m.timestamp() for m in read] == [(KAFKA_CREATE_TIME, t) for t in built[0].fired]
    assert all(t >= started for t in built[0].fired)
    assert kafka.committed(name, source) == {0: None}


@GUARANTEES
def test_a_timer_fired_in_a_turn_whose_process_raises_is_not_committed(
        bootstrap, new_topic, kafka, unique_name, guarantee: str) -> None:
    """A 0.3 s wall-clock timer fires at the start of each turn it falls due in, so it
    fires in the turn that reads the poison; that turn raises: its tick is neither
    committed nor (at-least-once) produced, and the input offsets stay uncommitted.
    Ticks of the turns before it, committed with no input, are there."""
    source, out, ticks = new_topic("in"), new_topic("out"), new_topic("ticks")
    kafka.produce(source, [b"a", b"poison"], timestamp=INPUT_TIME)
    name = unique_name("poison-timer")
    # classic batches: the timer falls due while the batch_wait gathers the poison
    processor, built = build(config(bootstrap, name, [source], batch_wait=2.0, max_latency=None,
                                    processing_guarantee=guarantee), (out, ticks))
    with pytest.raises(ProcessingError, match=r"ValueError: poison"):
        processor.run_loop()
    fired = built[0].fired
    assert fired, "the timer fired in the failing turn"
    assert [int(m.value()) for m in kafka.read_all(ticks)] == fired[:-1]
    assert kafka.committed(name, source) == {0: None}


@GUARANTEES
def test_a_timer_whose_delivery_fails_leaves_its_turn_uncommitted(
        bootstrap, new_topic, kafka, unique_name, guarantee: str) -> None:
    """A stream-time timer fires right after the record that starts its stream time,
    in the same turn, and sends a message over the ticks topic's max.message.bytes:
    ProduceError, the input offset uncommitted, nothing readable by read_committed
    consumers on the ticks topic."""
    source, out = new_topic("in"), new_topic("out")
    ticks = new_topic("ticks", **{"max.message.bytes": "1000"})
    kafka.produce(source, [b"a"], timestamp=INPUT_TIME)
    name = unique_name("big-timer")
    cfg = config(bootstrap, name, [source], processing_guarantee=guarantee)
    processor, built = build(cfg, (out, ticks), kind="stream_time", interval=60, big=True)
    with pytest.raises(ProduceError, match=f"delivery to {ticks}"):
        processor.run_loop(until_caught_up=True)
    assert built[0].fired == [INPUT_TIME]
    assert kafka.committed(name, source) == {0: None}
    assert kafka.read_all(ticks) == []


class Seen(MessageProcessor):
    """Sends, per input, its timestamp and type as seen by process(), with the inherited
    output timestamp; one message with an overridden timestamp; and a stream-time timer
    that sends its firing time."""

    def __init__(self, context: ProcessorContext, out: str) -> None:
        self.out = out
        context.schedule(60, self.tick)

    def process(self, messages: list[Message], sender: Sender) -> None:
        for m in messages:
            sender.send(self.out, json.dumps({"kind": "inherited", "timestamp": m.timestamp,
                                              "type": m.timestamp_type}).encode())
        sender.send(self.out, b'{"kind": "overridden"}', timestamp=OVERRIDE)

    def tick(self, timestamp: int, sender: Sender) -> None:
        sender.send(self.out, json.dumps({"kind": "timer", "timestamp": timestamp}).encode())


def test_output_timestamps_inherited_overridden_and_timer_fired(
        bootstrap, new_topic, kafka, unique_name) -> None:
    """One input with create time T: its output carries T; timestamp= overrides; the
    stream-time timer's output carries the stream time (T). Read back from the broker."""
    source, out = new_topic("in"), new_topic("out")
    kafka.produce(source, [b"a"], timestamp=INPUT_TIME)
    name = unique_name("stamps")
    with TopicProcessor(config(bootstrap, name, [source]), lambda c: Seen(c, out)) as loop:
        loop.run_loop(until_caught_up=True)
    stamped = {json.loads(m.value())["kind"]: (json.loads(m.value()), m.timestamp())
               for m in kafka.read_all(out)}
    assert stamped["inherited"] == (
        {"kind": "inherited", "timestamp": INPUT_TIME, "type": TIMESTAMP_CREATE_TIME},
        (KAFKA_CREATE_TIME, INPUT_TIME))
    assert stamped["overridden"][1] == (KAFKA_CREATE_TIME, OVERRIDE)
    assert stamped["timer"] == ({"kind": "timer", "timestamp": INPUT_TIME},
                                (KAFKA_CREATE_TIME, INPUT_TIME))


def test_log_append_time_input_is_seen_as_such_and_inherited(
        bootstrap, new_topic, kafka, unique_name) -> None:
    """An input topic with message.timestamp.type=LogAppendTime: process() sees the
    broker's append time with TIMESTAMP_LOG_APPEND_TIME, and the output inherits it."""
    source = new_topic("in", **{"message.timestamp.type": "LogAppendTime"})
    out = new_topic("out")
    before = int(time.time() * 1000)
    kafka.produce(source, [b"a"], timestamp=INPUT_TIME)  # the broker replaces it
    name = unique_name("append-time")
    with TopicProcessor(config(bootstrap, name, [source]), lambda c: Seen(c, out)) as loop:
        loop.run_loop(until_caught_up=True)
    (inherited,) = [m for m in kafka.read_all(out)
                    if json.loads(m.value())["kind"] == "inherited"]
    seen = json.loads(inherited.value())
    assert seen["type"] == TIMESTAMP_LOG_APPEND_TIME
    assert seen["timestamp"] >= before
    assert inherited.timestamp() == (KAFKA_CREATE_TIME, seen["timestamp"])
