"""Timers and tasks in the real ``TopicProcessor``, on ``InMemoryBroker``: wall-clock
ones fire while the loop is idle (the broker's clock moves by the consume timeouts, so
nothing sleeps), and what a timer or task sends is committed with its turn or not at
all: when that turn fails later, or the exactly-once retry runs it again."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

import pytest

from kasper_py import (
    TIMESTAMP_CREATE_TIME,
    Config,
    Message,
    MessageProcessor,
    ProcessingError,
    ProcessorContext,
    ProduceError,
    Sender,
    Task,
    TopicProcessor,
)
from kasper_py.testing import InMemoryBroker

ALO = Config(name="timed", bootstrap_servers="in-memory", input_topics=["in"],
             batch_size=100, batch_wait=1.0, max_latency=None)  # timers fall due in a batch_wait
EOS = dataclasses.replace(ALO, processing_guarantee="exactly_once")
GUARANTEES = pytest.mark.parametrize("config", [ALO, EOS], ids=["at-least-once", "exactly-once"])


class Ticking(MessageProcessor):
    """Forwards values to "out", raising on b"poison"; a timer sends its firing time to
    "ticks" and closes the loop after ``stop_after`` firings."""

    def __init__(self, context: ProcessorContext, loop: list[TopicProcessor], *,
                 kind: Any = "wall_clock", interval: float = 0.5,
                 stop_after: int | None = None, fired: list[int] | None = None) -> None:
        self.loop, self.stop_after = loop, stop_after
        self.fired = [] if fired is None else fired
        context.schedule(interval, self.tick, kind)

    def process(self, messages: list[Message], sender: Sender) -> None:
        for message in messages:
            if message.value == b"poison":
                raise ValueError("poison")
            sender.send("out", message.value, partition=message.partition)

    def tick(self, timestamp: int, sender: Sender) -> None:
        self.fired.append(timestamp)
        sender.send("ticks", str(timestamp).encode())
        if self.stop_after is not None and len(self.fired) >= self.stop_after:
            self.loop[0].close()  # from the loop's own thread: it stops after this turn


def broker(partitions: int = 1) -> InMemoryBroker:
    broker = InMemoryBroker()
    for topic in ("in", "out", "ticks"):
        broker.create_topic(topic, partitions=partitions)
    return broker


def loop(broker: InMemoryBroker, config: Config, tasks: tuple[Task, ...] = (),
         **options: Any) -> TopicProcessor:
    holder: list[TopicProcessor] = []
    processor = TopicProcessor(config, lambda c: Ticking(c, holder, **options),
                               clients=broker.clients(config), tasks=tasks)
    holder.append(processor)
    return processor


@GUARANTEES
def test_a_wall_clock_timer_fires_while_the_loop_is_idle(config: Config) -> None:
    """No input at all: the loop runs a turn of its own for each firing; the ticks are
    in the log (exactly-once: committed), stamped with the wall-clock time that fired
    them, at least an interval apart; no offset is committed."""
    memory = broker()
    loop(memory, config, stop_after=3).run_loop()
    ticks = memory.read("ticks")
    times = [int(m.value) for m in ticks]
    assert len(times) == 3
    assert [m.timestamp for m in ticks] == times
    assert {m.timestamp_type for m in ticks} == {TIMESTAMP_CREATE_TIME}
    assert all(later - earlier >= 500 for earlier, later in itertools.pairwise(times))
    assert memory.committed(config.group) == {}


def closing_report(holder: list[TopicProcessor], runs: list[int]
                   ) -> Callable[[int, Sender], None]:
    """A task function: notes when it runs, sends b"report" to "ticks", and closes the
    loop on its second run."""
    def report(timestamp: int, sender: Sender) -> None:
        runs.append(timestamp)
        sender.send("ticks", b"report")
        if len(runs) == 2:
            holder[0].close()
    return report


@GUARANTEES
def test_a_task_runs_while_the_loop_is_idle(config: Config) -> None:
    """A 2 s task runs on the wall clock with no input; its output is stamped with the
    time it ran at."""
    memory = broker()
    holder: list[TopicProcessor] = []
    runs: list[int] = []
    task = Task(closing_report(holder, runs), every=2)
    holder.append(loop(memory, config, (task,), interval=3600))
    holder[0].run_loop()
    assert [m.timestamp for m in memory.read("ticks")] == runs
    assert runs[1] - runs[0] == 2000


@GUARANTEES
@pytest.mark.parametrize("failure", ["process raises", "delivery fails"])
def test_a_due_timers_output_is_not_committed_when_its_turn_fails(config: Config,
                                                                  failure: str) -> None:
    """The wall-clock timer falls due while a batch is read; it fires first in that
    turn, then process() raises, or the tick's delivery fails: the loop stops, no
    offset is committed and no tick is in the log. A restarted, fixed loop fires it
    again and commits it once, with the batch."""
    memory = broker()
    for value in (b"a", b"poison" if failure == "process raises" else b"b", b"c"):
        memory.produce("in", value)
    if failure == "delivery fails":
        memory.faults.fail_delivery(nth=1)  # the tick: timers run before the input
    fired: list[int] = []
    error = ProcessingError if failure == "process raises" else ProduceError
    with pytest.raises(error):
        loop(memory, config, fired=fired).run_loop(until_caught_up=True)
    assert len(fired) == 1
    assert memory.read("ticks") == []
    assert memory.committed(config.group) == {}

    if failure == "process raises":
        memory = _without_poison(memory)
    restarted = loop(memory, config)
    restarted.run_loop(until_caught_up=True)
    restarted.close()
    assert len(memory.read("ticks")) == 1
    assert memory.committed(config.group) == {("in", 0): 3}


def _without_poison(memory: InMemoryBroker) -> InMemoryBroker:
    """The same input with the poison fixed, as a redeployed processor would see it."""
    fixed = broker()
    for message in memory.read("in"):
        fixed.produce("in", b"b" if message.value == b"poison" else message.value)
    return fixed


@GUARANTEES
def test_a_stream_time_timer_is_not_committed_when_another_partition_raises(
        config: Config) -> None:
    """One batch of two partitions: partition 0's records advance its stream time and
    its timer fires right after them; partition 1's process() then raises. Nothing of
    the turn is committed: no tick in the log, no offsets."""
    memory = broker(partitions=2)
    memory.produce("in", b"a", partition=0, timestamp=60_000)
    memory.produce("in", b"poison", partition=1, timestamp=60_000)
    fired: list[int] = []
    with pytest.raises(ProcessingError, match=r"process\(\) of partition 1 raised ValueError"):
        loop(memory, config, kind="stream_time", interval=10, fired=fired).run_loop(
            until_caught_up=True)
    assert fired == [60_000]
    assert memory.read("ticks") == []
    assert memory.committed(config.group) == {}


def test_a_task_runs_again_when_the_exactly_once_retry_runs_its_turn_again() -> None:
    """Exactly-once: the turn running a task aborts on a retriable commit failure; the
    loop runs the turn again, the task runs again, and its output is in the log once."""
    memory = broker()
    holder: list[TopicProcessor] = []
    runs: list[int] = []
    task = Task(closing_report(holder, runs), every=1)
    holder.append(loop(memory, EOS, (task,), interval=3600))
    memory.faults.fail_commit(retriable=True)
    holder[0].run_loop()
    assert len(runs) == 2  # the same run, done twice
    assert [(m.value, m.timestamp) for m in memory.read("ticks")] == [(b"report", runs[1])]
    assert memory.faults.armed() == []
