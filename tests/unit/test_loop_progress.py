"""Where a loop stands (``kasper_py.loop.progress``) on ``InMemoryBroker``: committed
offsets (or where ``auto_offset_reset`` starts), the ends, what is left to consume, and
the report of a turn."""

from __future__ import annotations

import dataclasses

from structlog.testing import capture_logs

from kasper_py import Config
from kasper_py.kafka.batching import Batch, OffsetRange
from kasper_py.kafka.offsets import OffsetTracker
from kasper_py.kafka.ports import InputPort
from kasper_py.loop.progress import behind, consumed_all, progress, report
from kasper_py.observability.observe import NoopObserver, TurnStats
from kasper_py.testing import InMemoryBroker

CONFIG = Config(name="progress", bootstrap_servers="in-memory", input_topics=["in"])


def assigned_consumer(records: int, config: Config = CONFIG) -> InputPort:
    broker = InMemoryBroker()
    broker.create_topic("in", 2)
    for n in range(records):
        broker.produce("in", b"v", partition=n % 2)
    consumer = broker.clients(config).consumer
    consumer.assign([0, 1])
    return consumer


def test_a_partition_with_nothing_committed_counts_from_where_the_loop_starts() -> None:
    consumer = assigned_consumer(6)
    offsets = OffsetTracker()
    offsets.mark_committed({("in", 0): 1})
    committed, highs = progress(consumer, offsets, "earliest")
    assert committed == {("in", 0): 1, ("in", 1): 0} and highs == {("in", 0): 3, ("in", 1): 3}
    committed, _ = progress(consumer, offsets, "latest")
    assert committed == {("in", 0): 1, ("in", 1): 3}
    assert behind(committed, highs) == 2 and behind({}, {}) is None


def test_consumed_all_once_every_position_reached_its_end() -> None:
    consumer = assigned_consumer(4)
    assert not consumed_all(consumer, "earliest")
    consumer.consume(10, 0)
    assert consumed_all(consumer, "earliest")
    latest = assigned_consumer(4, dataclasses.replace(CONFIG, auto_offset_reset="latest"))
    assert consumed_all(latest, "latest")


class DeletedBelowCommitted:
    """A consumer that read nothing yet (no position) of a partition whose committed
    offset, 1360, is below its low watermark, 1526: retention deleted the rest of its
    records, so the consumer resets to the low watermark and finds nothing to read."""

    from_start: frozenset[str] = frozenset()

    def positions(self) -> dict[tuple[str, int], int | None]:
        return {("in", 0): None}

    def committed(self, keys: object = None) -> dict[tuple[str, int], int | None]:
        return {("in", 0): 1360}

    def watermarks(self, key: tuple[str, int], cached: bool = False) -> tuple[int, int]:
        return 1526, 1526


def test_a_committed_offset_whose_records_were_deleted_is_caught_up_at_the_end() -> None:
    """Nothing is left to read where every record past the committed offset was deleted:
    ``--until-caught-up`` returns instead of waiting for records that cannot come (the
    windowed join's restart hang, when the broker's retention deleted old input)."""
    consumer = DeletedBelowCommitted()
    assert consumed_all(consumer, "earliest")  # type: ignore[arg-type]
    assert consumed_all(consumer, "latest")  # type: ignore[arg-type]


class Turns(NoopObserver):
    def __init__(self) -> None:
        self.turns: list[TurnStats] = []

    def on_turn(self, stats: TurnStats) -> None:
        self.turns.append(stats)


def test_a_turn_is_reported_to_the_observer_and_logged_per_partition() -> None:
    batch = Batch(ranges={("in", 0): OffsetRange(3, 5, 3), ("in", 1): OffsetRange(0, 0, 1)})
    stats = TurnStats(batch, 7, {"process": 0.002, "commit": 0.001})
    observer = Turns()
    with capture_logs() as logs:
        report(observer, stats, "progress")
    assert observer.turns == [stats]
    lines = [e for e in logs if e["event"] == "kasper.batch"]
    assert [(e["partition"], e["first_offset"], e["last_offset"]) for e in lines] == [
        (0, 3, 5), (1, 0, 0)]
    assert lines[0]["turn_produced"] == 7 and lines[0]["process_ms"] == 2.0
