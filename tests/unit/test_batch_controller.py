"""Adaptive batching (``Config.max_latency``): the batch controller's rule, the
collector's linger on a fake clock, and the real loop on the in-memory broker. No
timing is asserted: the controller is fed durations, the collector a clock."""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from typing import Any

import pytest

from kasper_py import Config, ConfigError, Message, MessageProcessor, Sender, TopicProcessor
from kasper_py.cli.base import CliError, add_config_flags, config_from_args, load_config
from kasper_py.kafka.batching import BatchController, Collector
from kasper_py.observability.observe import NoopObserver, TurnStats
from kasper_py.testing import InMemoryBroker

TARGET = 0.05
FAST = 0.004
"""Seconds of a turn well inside the target."""


def grown(controller: BatchController, size: int) -> BatchController:
    """``controller`` after turns that found enough input waiting to reach ``size``."""
    controller.observe(controller.size, size, FAST)
    assert controller.size == size
    return controller


# -- the controller ---------------------------------------------------------------------

def test_starts_small_and_grows_when_every_batch_comes_full() -> None:
    """Input that fills each batch doubles the next one, up to the largest."""
    controller = BatchController(TARGET, largest=1000, smallest=100)
    assert controller.size == 100
    sizes = [controller.observe(controller.size, None, FAST) for _ in range(5)]
    assert sizes == [200, 400, 800, 1000, 1000]


def test_a_backlog_jumps_the_batch_to_what_waits() -> None:
    """When more records wait than a batch holds (lag builds), the next batch takes
    them all at once, within the largest batch."""
    controller = BatchController(TARGET, largest=10_000, smallest=100)
    assert controller.observe(40, 3_000, FAST) == 3_000
    assert controller.observe(3_000, 250_000, 0.3) == 10_000  # slow, but behind: grow


def test_light_input_shrinks_the_batch_toward_twice_what_arrives() -> None:
    """Turns that take few records halve the batch each time, down to twice what a
    turn took, never under the smallest."""
    controller = grown(BatchController(TARGET, largest=10_000, smallest=100), 8_000)
    sizes = [controller.observe(300, 0, FAST) for _ in range(4)]
    assert sizes == [4_000, 2_000, 1_000, 600]
    assert [controller.observe(10, 0, FAST) for _ in range(3)] == [300, 150, 100]


def test_a_slow_turn_halves_the_batch_when_nothing_waits() -> None:
    """A turn slower than half the target with no backlog (a slow processor or store)
    makes the next batch half of what that turn took."""
    controller = grown(BatchController(TARGET, largest=10_000, smallest=100), 4_000)
    assert controller.observe(3_000, 0, TARGET) == 1_500
    assert controller.observe(1_400, 0, TARGET) == 700


def test_linger_is_what_the_target_leaves_after_two_turns() -> None:
    """Fast turns leave a fifth of the target to wait for more records; turns that
    take a quarter of the target or more leave none (take what has arrived)."""
    controller = BatchController(TARGET, largest=1000)
    assert controller.linger == pytest.approx(TARGET / 5)  # no turn seen yet
    controller.observe(10, 0, FAST)
    assert controller.linger == pytest.approx(TARGET / 5)
    for _ in range(30):
        controller.observe(10, 0, TARGET / 6)
    assert 0 <= controller.linger < TARGET / 5
    for _ in range(30):
        controller.observe(10, 0, TARGET)
    assert controller.linger == 0


def test_size_stays_within_its_bounds_whatever_it_sees() -> None:
    """Random observations never take the target outside smallest..largest, and the
    linger never outside 0..a fifth of the target."""
    rng = random.Random(15)
    controller = BatchController(TARGET, largest=5_000, smallest=50)
    for _ in range(2_000):
        taken = rng.choice([0, 1, rng.randrange(10_000), controller.size])
        waiting = rng.choice([None, 0, rng.randrange(1_000_000)])
        controller.observe(taken, waiting, rng.choice([0.0, FAST, rng.random() * 2]))
        assert 50 <= controller.size <= 5_000
        assert 0 <= controller.linger <= TARGET / 5


def test_a_largest_batch_under_the_smallest_bounds_both() -> None:
    """batch_size below the controller's usual floor is the only size it uses."""
    controller = BatchController(TARGET, largest=20)
    assert controller.size == 20
    assert controller.observe(0, 0, FAST) == 20


@pytest.mark.parametrize(("max_latency", "largest", "smallest", "match"), [
    (0, 10, 1, r"max_latency must be positive"),
    (-1.0, 10, 1, r"max_latency must be positive"),
    (0.05, 0, 1, r"batch bounds must be at least 1"),
    (0.05, 10, 0, r"batch bounds must be at least 1"),
])
def test_bad_bounds_are_refused(max_latency: float, largest: int, smallest: int,
                                match: str) -> None:
    """The controller names what is wrong with its arguments."""
    with pytest.raises(ValueError, match=match):
        BatchController(max_latency, largest, smallest)


# -- the collector's linger ---------------------------------------------------------------

class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Arrivals:
    """A consume stand-in over records that arrive at given times on a fake clock: it
    returns what has arrived, or waits (moves the clock on) until enough has, or until
    its timeout is over."""

    def __init__(self, clock: FakeClock, times: Sequence[float]) -> None:
        self.clock, self.pending = clock, sorted(times)
        self.calls: list[tuple[int, float]] = []

    def __call__(self, max_count: int, timeout: float) -> list[float]:
        self.calls.append((max_count, timeout))
        end = self.clock.now + timeout
        arrived = [t for t in self.pending if t <= self.clock.now]
        if len(arrived) < max_count:
            later = [t for t in self.pending if self.clock.now < t <= end]
            needed = max_count - len(arrived)
            self.clock.now = later[needed - 1] if len(later) >= needed else end
        taken = [t for t in self.pending if t <= self.clock.now][:max_count]
        self.pending = self.pending[len(taken):]
        return taken


def test_linger_releases_a_batch_soon_after_its_first_record() -> None:
    """With a linger, a batch waits for its first record (a consume of one, which
    returns on arrival), then the linger, then takes what else was fetched."""
    clock = FakeClock()
    arrivals = Arrivals(clock, [0.300, 0.301, 0.302, 0.3045, 0.306, 0.5])
    collector = Collector(arrivals, 1000, 1.0, clock, linger=0.005)
    assert collector.gather()
    assert collector.take() == [0.300, 0.301, 0.302, 0.3045]
    assert clock.now == pytest.approx(0.305)
    assert arrivals.calls[0] == (1, 1.0)  # the first record ends the wait at once
    assert arrivals.calls[-1] == (996, 0)  # on release: what is fetched, no wait


def test_linger_zero_takes_what_is_fetched_without_waiting() -> None:
    """A linger of 0 takes the first record and what has arrived with it."""
    clock = FakeClock()
    arrivals = Arrivals(clock, [0.1, 0.1, 0.1, 0.2])
    collector = Collector(arrivals, 1000, 1.0, clock, linger=0.0)
    assert collector.gather()
    assert collector.take() == [0.1, 0.1, 0.1]
    assert clock.now == pytest.approx(0.1)


def test_linger_idle_batch_is_released_empty_after_batch_wait() -> None:
    """With nothing arriving, a batch still ends after batch_wait (the loop idles)."""
    clock = FakeClock()
    collector = Collector(Arrivals(clock, []), 1000, 1.0, clock, linger=0.005)
    assert collector.gather()
    assert collector.take() == []
    assert clock.now == pytest.approx(1.0)


def test_linger_batch_is_still_released_at_its_size() -> None:
    """A burst larger than the size makes a full batch at once; the rest waits."""
    clock = FakeClock()
    collector = Collector(Arrivals(clock, [0.0] * 50), 1000, 1.0, clock, linger=0.005)
    collector.size = 20
    assert collector.gather()
    assert collector.full
    assert len(collector.take()) == 20
    assert clock.now == 0.0


def test_linger_gathered_ahead_waits_for_the_turn_to_end() -> None:
    """Gathering ahead (``until``) stops when the turn's acks are in, and the batch
    is finished afterwards with what came meanwhile."""
    clock = FakeClock()
    arrivals = Arrivals(clock, [0.001, 0.002, 0.030, 0.031])
    collector = Collector(arrivals, 1000, 1.0, clock, linger=0.005)
    assert collector.gather(until=lambda: clock.now >= 0.004, step=0.005) is False
    assert collector.records == [0.001, 0.002]
    clock.now = 0.040  # the turn ends: its linger is long over
    assert collector.gather()
    assert collector.take() == [0.001, 0.002, 0.030, 0.031]


# -- Config ------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [0, -0.5, float("nan"), float("inf"), True, "0.05"])
def test_config_refuses_a_bad_max_latency(value: Any) -> None:
    """max_latency must be positive, finite seconds; the error names the field."""
    with pytest.raises(ConfigError, match=r"config field 'max_latency': must be a positive"):
        Config(name="p", bootstrap_servers="b:1", input_topics=["t"], max_latency=value)


def test_config_max_latency_lowers_the_producer_linger_only_when_set() -> None:
    """Without max_latency the producer lingers 5 ms; with 50 ms (the default), 1 ms; an
    override still wins."""
    base = {"name": "p", "bootstrap_servers": "b:1", "input_topics": ["t"]}
    assert Config(**base).to_producer_conf()["linger.ms"] == 1
    assert Config(**base, max_latency=None).to_producer_conf()["linger.ms"] == 5
    assert Config(**base, max_latency=0.05).to_producer_conf()["linger.ms"] == 1
    assert Config(**base, max_latency=2.0).to_producer_conf()["linger.ms"] == 5
    overridden = Config(**base, max_latency=0.05, producer_overrides={"linger.ms": 3})
    assert overridden.to_producer_conf()["linger.ms"] == 3


def test_max_latency_from_the_environment_and_the_command_line() -> None:
    """KASPER_MAX_LATENCY is read as seconds ('none' clears it), --max-latency too
    ('none' too)."""
    env = {"KASPER_NAME": "n", "KASPER_BOOTSTRAP_SERVERS": "b:1", "KASPER_INPUT_TOPICS": "t",
           "KASPER_MAX_LATENCY": "0.05"}
    assert load_config(None, env).max_latency == 0.05
    assert load_config(None, {**env, "KASPER_MAX_LATENCY": "none"}).max_latency is None
    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    args = parser.parse_args(["--max-latency", "0.02"])
    assert config_from_args(args, env).max_latency == 0.02
    args = parser.parse_args(["--max-latency", "none"])
    assert config_from_args(args, env).max_latency is None
    assert load_config(None, {k: v for k, v in env.items() if k != "KASPER_MAX_LATENCY"}
                       ).max_latency == 0.05  # the default: a latency target
    with pytest.raises(CliError, match=r"config field 'max_latency'"):
        load_config(None, {**env, "KASPER_MAX_LATENCY": "-1"})


# -- the loop on the in-memory broker -------------------------------------------------------

class Copy(MessageProcessor):
    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at = fail_at

    def process(self, messages: list[Message], sender: Sender) -> None:
        for m in messages:
            if m.offset == self.fail_at:
                raise RuntimeError(f"bad record at {m.offset}")
            sender.send("out", m.value)


class Targets(NoopObserver):
    """Keeps every turn's batch length and batch size target."""

    def __init__(self) -> None:
        self.turns: list[tuple[int, int | None]] = []

    def on_turn(self, stats: TurnStats) -> None:
        self.turns.append((len(stats.batch), stats.batch_size_target))


def loop_over(count: int, **settings: Any) -> tuple[InMemoryBroker, Config]:
    broker = InMemoryBroker()
    broker.create_topic("in", partitions=2)
    broker.create_topic("out", partitions=2)
    for n in range(count):
        broker.produce("in", b"v%d" % n, partition=n % 2)
    config = Config(name="adaptive", bootstrap_servers="in-memory", input_topics=["in"],
                    **settings)
    return broker, config


def test_loop_with_max_latency_grows_its_batches_through_a_backlog() -> None:
    """A backlog of 20,000 records: the target grows from the smallest batch to
    batch_size, every record is copied once and the commit is past the last."""
    broker, config = loop_over(20_000, max_latency=0.05, batch_size=5_000)
    observer = Targets()
    processor = TopicProcessor(config, lambda _c: Copy(), clients=broker.clients(config),
                               observer=observer)
    processor.run_loop(until_caught_up=True)
    processor.close()
    assert sorted(m.value for m in broker.read("out")) == sorted(
        b"v%d" % n for n in range(20_000))
    assert broker.committed("adaptive") == {("in", 0): 10_000, ("in", 1): 10_000}
    lengths = [length for length, _ in observer.turns]
    targets = [target for _, target in observer.turns]
    assert lengths[0] == 100  # the controller starts at its smallest batch
    assert max(targets) == 5_000 and max(lengths) == 5_000  # and grows to batch_size
    assert all(target is not None and 100 <= target <= 5_000 for target in targets)


def test_loop_without_max_latency_reports_batch_size_as_its_target() -> None:
    """Without max_latency batches are batch_size, as always, and so is the target."""
    broker, config = loop_over(2_500, batch_size=1_000, max_latency=None)
    observer = Targets()
    processor = TopicProcessor(config, lambda _c: Copy(), clients=broker.clients(config),
                               observer=observer)
    processor.run_loop(until_caught_up=True)
    processor.close()
    assert observer.turns == [(1_000, 1_000), (1_000, 1_000), (500, 1_000)]
