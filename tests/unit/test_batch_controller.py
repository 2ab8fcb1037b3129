"""Adaptive batching (``Config.max_latency``): the batch controller's rule, the
collector's linger on a fake clock, and the Config fields that set them (the real loop
on the in-memory broker: test_batch_sizing_loop.py). No timing is asserted: the
controller is fed durations, the collector a clock."""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from typing import Any

import pytest

from kasper_py import Config, ConfigError
from kasper_py.cli.base import CliError, add_config_flags, config_from_args, load_config
from kasper_py.kafka.batching import Collector
from kasper_py.kafka.sizing import (
    BACKLOG_TURN,
    LOCALITY_BYTES,
    RECORD_OVERHEAD,
    BatchController,
    FixedBatches,
)

TARGET = 0.05
PACE = 1e-6
"""Seconds a fast turn spends per record: its budget (ten targets) fits 500,000."""
FAST = 0.004
"""Seconds of a turn of a few records, well inside the target."""


def turn(records: int) -> float:
    """Seconds of a turn over ``records`` at the fast ``PACE``."""
    return records * PACE


def grown(controller: BatchController, size: int) -> BatchController:
    """``controller`` after turns that found enough input waiting to reach ``size``."""
    controller.observe(controller.size, size, turn(controller.size))
    assert controller.size == size
    return controller


# -- the controller ---------------------------------------------------------------------

def test_starts_small_and_grows_when_every_batch_comes_full() -> None:
    """Input that fills each batch doubles the next one, up to the largest."""
    controller = BatchController(TARGET, largest=1000, smallest=100)
    assert controller.size == 100
    sizes = [controller.observe(controller.size, None, turn(controller.size))
             for _ in range(5)]
    assert sizes == [200, 400, 800, 1000, 1000]


def test_a_backlog_jumps_the_batch_to_what_waits() -> None:
    """When more records wait than a batch holds (lag builds), the next batch takes
    them all at once, within the largest batch."""
    controller = BatchController(TARGET, largest=10_000, smallest=100)
    assert controller.observe(40, 3_000, turn(40)) == 3_000
    assert controller.observe(3_000, 250_000, turn(3_000)) == 10_000


def test_a_backlog_grows_a_batch_only_as_far_as_a_turn_of_ten_targets() -> None:
    """Under a backlog a turn may last BACKLOG_TURN targets: at the last turn's pace
    the batch stops growing where its turn would last longer, however much waits, and
    follows the pace as it changes."""
    budget = BACKLOG_TURN * TARGET
    controller = BatchController(TARGET, largest=1_000_000, smallest=100)
    assert controller.observe(100, 1_000_000, 100 * 100e-6) == int(budget / 100e-6)
    size = controller.size
    assert controller.observe(size, 1_000_000, size * 10e-6) == int(budget / 10e-6)
    size = controller.size
    assert controller.observe(size, 1_000_000, size * 1e-3) == int(budget / 1e-3)


def test_a_backlog_of_large_records_is_bounded_in_bytes() -> None:
    """The input's bytes per record (weighed as batches are read) cap a batch at
    ``largest_bytes``; small records leave the cap in records."""
    controller = BatchController(TARGET, largest=50_000, largest_bytes=16 * 2**20)
    controller.weigh(100, 100 * 4096)
    assert controller.observe(100, 1_000_000, turn(100)) == 4096
    controller.weigh(4096, 4096 * 100)  # smaller records: smoothed toward 100 bytes
    for _ in range(40):
        controller.weigh(4096, 4096 * 100)
    assert controller.observe(controller.size, 1_000_000, turn(controller.size)) == 50_000


def test_records_larger_than_the_bytes_allow_go_under_the_smallest_batch() -> None:
    """Records of 8 MiB under a 16 MiB bound: two a batch, under light input too; the
    smallest batch does not override the bytes."""
    controller = BatchController(TARGET, largest=20_000, largest_bytes=16 * 2**20)
    for _ in range(40):
        controller.weigh(10, 10 * 8 * 2**20)
    assert controller.observe(100, 1_000_000, turn(100)) == 2
    assert controller.observe(1, 0, FAST) == 2


def backlog(record_bytes: int, largest: int = 20_000) -> BatchController:
    """A controller with records of ``record_bytes`` weighed, grown to its ceiling
    (``largest``, or 16 MiB of records) by a backlog (a turn that reports no outputs,
    which the probe does not count)."""
    controller = BatchController(TARGET, largest=largest, largest_bytes=16 * 2**20)
    controller.weigh(1_000, 1_000 * record_bytes)
    controller.observe(100, 1_000_000, turn(100))
    assert controller.size == min(largest, 16 * 2**20 // record_bytes)
    return controller


def drain(controller: BatchController, outputs: Any, turns: int) -> list[int]:
    """``turns`` backlog turns, each taking the size asked and sending
    ``outputs(taken)``; the sizes asked after each."""
    sizes = []
    for _ in range(turns):
        taken = controller.size
        sizes.append(controller.observe(taken, 1_000_000, turn(taken), outputs(taken)))
    return sizes


def test_a_backlog_that_does_not_coalesce_stops_at_the_locality_bound() -> None:
    """A passthrough's backlog (one output per input) of 100-byte records: two turns
    at the largest batch, two at what LOCALITY_BYTES holds, then that bound."""
    controller = backlog(100)
    local = LOCALITY_BYTES // (100 + RECORD_OVERHEAD)
    assert controller.locality == local == 10_485
    sizes = drain(controller, lambda taken: taken, 10)
    assert sizes == [20_000, local, local] + [local] * 7


def test_a_backlog_that_coalesces_keeps_the_largest_batch() -> None:
    """A count over a bounded vocabulary (outputs grow slower than the batch): after
    the two sizes are counted, batches go back to the largest and stay there."""
    controller = backlog(50)
    local = controller.locality
    assert local is not None and local < 20_000
    sizes = drain(controller, lambda taken: min(taken, 9_000) + taken // 20, 10)
    assert sizes == [20_000, local, local] + [20_000] * 7


def test_the_two_sizes_are_counted_again_after_a_hundred_backlog_turns() -> None:
    """A processor that coalesced and no longer does (its input changed) is held to
    the locality bound once the probe runs again, a hundred backlog turns later."""
    controller = backlog(100)
    local = controller.locality
    coalescing = drain(controller, lambda taken: min(taken, 5_000), 100)
    assert coalescing[3:] == [20_000] * 97
    plain = drain(controller, lambda taken: taken, 10)
    assert plain[-3:] == [local] * 3 and 20_000 in plain


def test_the_locality_bound_follows_the_bytes_of_a_record() -> None:
    """Records of 1,000 bytes: the bound holds fewer of them; records so small that the
    bound is about the largest batch: no probe, batches stay the largest."""
    controller = backlog(1_000)
    local = LOCALITY_BYTES // (1_000 + RECORD_OVERHEAD)
    assert controller.locality == local == 4_194
    assert drain(controller, lambda taken: taken, 6) == [16_777, local] + [local] * 4
    small = backlog(100, largest=12_000)  # bound 10,485: within a quarter of 12,000
    assert drain(small, lambda taken: taken, 6) == [12_000] * 6


def test_a_batch_of_another_size_than_asked_is_not_counted() -> None:
    """A batch read ahead was sized before the turn that asked: a turn that took
    neither size (nor the size asked) does not count toward the probe."""
    controller = backlog(100)
    local = controller.locality
    assert local is not None
    controller.observe(5_000, 1_000_000, turn(5_000), 5_000)  # neither size
    controller.observe(local, 1_000_000, turn(local), local)  # the bound, not asked yet
    assert controller.size == 20_000
    assert drain(controller, lambda taken: taken, 4) == [20_000, local, local, local]


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
    """Fast turns leave a tenth of the target to wait for more records; turns that
    take a quarter of the target or more leave none (take what has arrived)."""
    controller = BatchController(TARGET, largest=1000)
    assert controller.linger == pytest.approx(TARGET / 10)  # no turn seen yet
    controller.observe(10, 0, FAST)
    assert controller.linger == pytest.approx(TARGET / 10)
    for _ in range(30):
        controller.observe(10, 0, TARGET / 4.5)
    assert 0 < controller.linger < TARGET / 10
    for _ in range(30):
        controller.observe(10, 0, TARGET)
    assert controller.linger == 0


def test_size_stays_within_its_bounds_whatever_it_sees() -> None:
    """Random observations never take the target outside smallest..largest (nor, once
    over the smallest, past what fits ten targets at the last pace or the bytes
    bound), and the linger never outside 0..a tenth of the target."""
    rng = random.Random(15)
    controller = BatchController(TARGET, largest=5_000, smallest=50, largest_bytes=2**20)
    for _ in range(2_000):
        taken = rng.choice([0, 1, rng.randrange(10_000), controller.size])
        waiting = rng.choice([None, 0, rng.randrange(1_000_000)])
        controller.weigh(rng.randrange(1, 100), rng.randrange(10_000))
        seconds = rng.choice([0.0, FAST, rng.random() * 2])
        size = controller.observe(taken, waiting, seconds)
        assert 50 <= size <= 5_000
        assert size == 50 or size * (controller.record_bytes or 0) <= 2**20
        assert size == 50 or not taken or size * seconds / taken <= BACKLOG_TURN * TARGET
        assert 0 <= controller.linger <= TARGET / 10


def test_a_largest_batch_under_the_smallest_bounds_both() -> None:
    """batch_size below the controller's usual floor is the only size it uses."""
    controller = BatchController(TARGET, largest=20)
    assert controller.size == 20
    assert controller.observe(0, 0, FAST) == 20


@pytest.mark.parametrize(("max_latency", "largest", "smallest", "largest_bytes", "match"), [
    (0, 10, 1, None, r"max_latency must be positive"),
    (-1.0, 10, 1, None, r"max_latency must be positive"),
    (0.05, 0, 1, None, r"batch bounds must be at least 1"),
    (0.05, 10, 0, None, r"batch bounds must be at least 1"),
    (0.05, 10, 1, 0, r"batch bounds must be at least 1"),
])
def test_bad_bounds_are_refused(max_latency: float, largest: int, smallest: int,
                                largest_bytes: int | None, match: str) -> None:
    """The controller names what is wrong with its arguments."""
    with pytest.raises(ValueError, match=match):
        BatchController(max_latency, largest, smallest, largest_bytes)


def test_fixed_batches_are_batch_size_whatever_comes() -> None:
    """Kasper's classic batches: the size never moves, nothing lingers, no byte bound."""
    fixed = FixedBatches(1_000)
    fixed.weigh(10, 10 * 2**20)
    assert [fixed.observe(taken, 1_000_000, 5.0) for taken in (1_000, 3, 0)] == [1_000] * 3
    assert (fixed.size, fixed.linger, fixed.max_bytes) == (1_000, None, None)


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


def test_batch_size_none_is_chosen_by_the_batching_mode() -> None:
    """batch_size defaults to None: 20,000 at most with a latency target, Kasper's 1,000
    with classic batches; a batch_size given is the largest batch in both."""
    base = {"name": "p", "bootstrap_servers": "b:1", "input_topics": ["t"]}
    assert Config(**base).batch_size is None
    assert Config(**base).largest_batch == 20_000
    assert Config(**base, max_latency=None).largest_batch == 1_000
    assert Config(**base, batch_size=7).largest_batch == 7
    assert Config(**base, batch_size=7, max_latency=None).largest_batch == 7


@pytest.mark.parametrize(("name", "value", "match"), [
    ("batch_size", 0, r"must be an int in 1..1000000 or None"),
    ("batch_size", "100", r"must be an int in 1..1000000 or None"),
    ("batch_bytes", 0, r"must be a positive int of bytes"),
    ("batch_bytes", 1.5, r"must be a positive int of bytes"),
    ("batch_bytes", True, r"must be a positive int of bytes"),
])
def test_config_refuses_bad_batch_bounds_naming_the_field(name: str, value: Any,
                                                          match: str) -> None:
    """batch_size and batch_bytes errors name their field."""
    with pytest.raises(ConfigError, match=rf"config field '{name}': {match}"):
        Config(name="p", bootstrap_servers="b:1", input_topics=["t"], **{name: value})


def test_the_prefetch_queue_holds_the_largest_batches() -> None:
    """The consumer's queue keeps at least the largest batch per partition, and at least
    two batches' bytes (never under librdkafka's 64 MiB, never over its maximum)."""
    base = {"name": "p", "bootstrap_servers": "b:1", "input_topics": ["t"]}
    conf = Config(**base).to_consumer_conf()
    assert conf["queued.min.messages"] == 100_000
    assert conf["queued.max.messages.kbytes"] == 65_536
    conf = Config(**base, batch_size=300_000, batch_bytes=256 * 2**20).to_consumer_conf()
    assert conf["queued.min.messages"] == 300_000
    assert conf["queued.max.messages.kbytes"] == 2 * 256 * 1024
    assert Config(**base, batch_bytes=2**40).to_consumer_conf()[
        "queued.max.messages.kbytes"] == 2_097_151


def test_batch_size_and_bytes_from_toml_the_environment_and_flags(tmp_path: Any) -> None:
    """batch_size 'none' (or left out) is the automatic choice; batch_bytes reads as
    an int from TOML and KASPER_BATCH_BYTES."""
    env = {"KASPER_NAME": "n", "KASPER_BOOTSTRAP_SERVERS": "b:1", "KASPER_INPUT_TOPICS": "t"}
    assert load_config(None, env).batch_size is None
    assert load_config(None, {**env, "KASPER_BATCH_SIZE": "none"}).batch_size is None
    assert load_config(None, {**env, "KASPER_BATCH_BYTES": "1048576"}).batch_bytes == 2**20
    path = tmp_path / "kasper.toml"
    path.write_text('batch_size = "none"\nbatch_bytes = 4096\n')
    config = load_config(str(path), env)
    assert (config.batch_size, config.batch_bytes) == (None, 4096)
    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    assert config_from_args(parser.parse_args(["--batch-size", "none"]), env).batch_size is None
    with pytest.raises(CliError, match=r"config field 'batch_bytes'"):
        load_config(None, {**env, "KASPER_BATCH_BYTES": "-1"})
