"""Windowed tables and joins in the testing driver: bad input named in the error, a
failed turn leaves nothing of its window writes behind, windows kept in RocksDB survive
a new processor, sessions merge, and the stream-stream join (inner and left, within and
outside the difference, late records, expiry)."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from kasper_py import Config, Message, MessageProcessor, ProcessingError, ProcessorContext, Sender
from kasper_py.exceptions import StoreError
from kasper_py.stores.memory import MemoryTable
from kasper_py.stores.redis import RedisTable
from kasper_py.stores.rocksdb import RocksDBTable
from kasper_py.testing import ProcessorDriver, make_message
from kasper_py.windows import (
    Aggregation,
    Hopping,
    Session,
    Sliding,
    StreamJoin,
    Tumbling,
    WindowedTable,
    WindowKind,
    count,
    reduce,
    sum_of,
)


class Counts(MessageProcessor):
    """Counts per key in ``kind`` windows; a value "boom" raises after the update."""

    def __init__(self, context: ProcessorContext, kind: WindowKind | None = None,
                 emit: Any = "updates", store: str = "windows") -> None:
        self.table = WindowedTable(context, store, kind or Tumbling(0.01), count(), emit=emit)
        self.results: list[Any] = []

    def process(self, messages: list[Message], sender: Sender) -> None:
        results = self.table.update((m.key, m.timestamp, m.value) for m in messages)
        if any(m.value == "boom" for m in messages):
            raise RuntimeError("boom")
        self.results.append([tuple(r) for r in results])


def views(*times: int, key: str = "a", value: str = "v") -> list[Message]:
    return [make_message("in", value, key, timestamp=t) for t in times]


def processor_of(driver: ProcessorDriver) -> Any:
    return driver.processor()


@pytest.mark.parametrize(("build", "message"), [
    (lambda: Tumbling(0), "tumbling window size must be more than 0 s"),
    (lambda: Tumbling(-5), "tumbling window size must be more than 0 s"),
    (lambda: Hopping(10, advance=20),
     "hopping window advance (20 s) must not exceed its size (10 s)"),
    (lambda: Hopping(10, advance=0), "hopping window advance must be more than 0 s"),
    (lambda: Sliding(1, grace=-1), "grace must be a finite number of seconds >= 0"),
    (lambda: Session("5"), "session inactivity gap must be seconds"),
    (lambda: Tumbling(float("nan")), "tumbling window size must be more than 0 s"),
])
def test_invalid_windows_say_what_is_wrong(build: Any, message: str) -> None:
    """Sizes <= 0, an advance over the size, a negative grace, a non-number: ValueError
    naming the field."""
    with pytest.raises(ValueError, match=rf"^{re.escape(message)}"):
        build()


def test_durations_take_timedeltas_and_seconds() -> None:
    """Durations are seconds or timedeltas, kept in milliseconds."""
    kind = Hopping(timedelta(minutes=5), advance=60, grace=0.5)
    assert (kind.size_ms, kind.advance_ms, kind.grace_ms) == (300_000, 60_000, 500)
    assert list(kind.starts(360_000)) == [120_000, 180_000, 240_000, 300_000, 360_000]


def test_invalid_table_arguments_are_refused(tmp_path: Path) -> None:
    """A bad emit mode, a session without merger, a store with serdes of its own, or a
    store that cannot list its entries is refused when the table is built."""
    def build(**kwargs: Any) -> Any:
        return lambda c: Counts(c, **kwargs)

    bad_emit = ProcessorDriver(build(emit="sometimes"), stores=[MemoryTable("windows")])
    with pytest.raises(ValueError, match=r"emit must be 'updates' or 'final'"):
        bad_emit.processor()

    def no_merger(context: ProcessorContext) -> Any:
        return WindowedTable(context, "windows", Session(1), Aggregation(list, lambda a, v: a))

    with pytest.raises(ValueError, match=r"session windows need an Aggregation with a merger"):
        ProcessorDriver(no_merger, stores=[MemoryTable("windows")]).processor()
    config = Config(name="w", bootstrap_servers="unused:0", input_topics=["in"],
                    state_dir=str(tmp_path))
    json_table = ProcessorDriver(build(), config=config,
                                 stores=[RocksDBTable("windows", changelog=False)])
    with pytest.raises(ValueError, match=r"declare it with key_serde='bytes', value_serde='bytes'"):
        json_table.processor()
    redis = RedisTable("windows", url="redis://127.0.0.1:1/0", key_serde="bytes",
                       value_serde="bytes")
    with pytest.raises(StoreError, match=r"windows and joins need a local table"):
        ProcessorDriver(build(), config=config, stores=[redis]).processor()


def test_a_record_without_timestamp_is_named_in_the_error() -> None:
    """A record with no event time stops the turn with the key and timestamp named, and
    nothing is committed."""
    driver = ProcessorDriver(Counts, stores=[MemoryTable("windows")])
    with pytest.raises(ProcessingError, match=r"record with key 'a' has timestamp None"):
        driver.process([make_message("in", "v", "a")])
    assert driver.committed == {}


def test_a_failed_turn_leaves_no_window_writes_behind() -> None:
    """The processor raises after updating its windows: the turn is not committed, the
    store holds what it held before, and the next batch counts as if the failed one had
    never been seen (the index is rebuilt from the store)."""
    driver = ProcessorDriver(Counts, stores=[MemoryTable("windows")])
    driver.process(views(1, 2))
    before = dict(driver.store("windows").items())  # type: ignore[attr-defined]
    with pytest.raises(ProcessingError, match=r"boom"):
        driver.process(views(3, 15, value="boom"))
    assert driver.committed == {("in", 0): 2}
    assert dict(driver.store("windows").items()) == before  # type: ignore[attr-defined]
    driver.process(views(4))
    assert processor_of(driver).results[-1] == [("a", 0, 10, 3)]
    assert processor_of(driver).table.stream_time == 4  # 15 never happened


def test_final_results_are_emitted_once_when_the_window_closes() -> None:
    """emit="final": nothing until stream time reaches end + grace; then the count once,
    and the window leaves the store."""
    driver = ProcessorDriver(lambda c: Counts(c, Tumbling(0.01, grace=0.005), "final"),
                             stores=[MemoryTable("windows")])
    driver.process(views(1, 9))
    driver.process(views(14))  # 14 < 10 + 5: still open
    driver.process(views(8, 15))  # 8 is on time (stream time 14); 15 closes [0, 10)
    driver.process(views(2, 30))  # 2 is late; 30 closes [10, 20)
    assert processor_of(driver).results == [[], [], [("a", 0, 10, 3)], [("a", 10, 20, 2)]]
    assert processor_of(driver).table.fetch("a", 0, 100) == [("a", 30, 40, 1)]
    assert processor_of(driver).table.late_records == 1
    assert {k[:1] for k in dict(driver.store("windows").items())} == {b"m", b"w"}  # type: ignore[attr-defined]


def test_windows_in_rocksdb_carry_on_in_a_new_processor(tmp_path: Path) -> None:
    """A RocksDB table (no changelog here) keeps windows and stream time: a processor
    built on the reopened folder closes the window the first one began."""
    config = Config(name="w", bootstrap_servers="unused:0", input_topics=["in"],
                    state_dir=str(tmp_path))

    def driver() -> ProcessorDriver:
        table = RocksDBTable("windows", changelog=False, key_serde="bytes", value_serde="bytes")
        return ProcessorDriver(lambda c: Counts(c, Tumbling(0.01), "final"), config=config,
                               stores=[table])

    first = driver()
    first.process(views(1, 2, 3))
    for _, _, store in first._engine.stores():
        store.close()
    second = driver()
    second.processor(0)  # opening the table seeds the partition's stream time
    assert second.stream_time(0) == 3
    second.process(views(12))
    assert processor_of(second).results == [[("a", 0, 10, 3)]]
    assert processor_of(second).table.stream_time == 12


def test_sessions_merge_when_a_record_bridges_them() -> None:
    """Two sessions 3 ms apart with a 2 ms gap; a record between them merges both, and
    emit="updates" sends the merged session and deletes (None) the two it replaced."""
    def build(context: ProcessorContext) -> Any:
        return Counts(context, Session(0.002, grace=0.01))

    driver = ProcessorDriver(build, stores=[MemoryTable("windows")])
    driver.process(views(10, 11, 15))
    driver.process(views(13))
    assert processor_of(driver).results == [
        [("a", 10, 12, 2), ("a", 15, 16, 1)],
        [("a", 10, 12, None), ("a", 10, 16, 4), ("a", 15, 16, None)]]


def test_hopping_sliding_and_reduce() -> None:
    """A record falls in every hopping window holding it; sliding windows follow Kafka
    Streams' example; reduce() keeps the largest value."""
    driver = ProcessorDriver(lambda c: Counts(c, Hopping(0.01, advance=0.005)),
                             stores=[MemoryTable("windows")])
    driver.process(views(12))
    assert processor_of(driver).results == [[("a", 5, 15, 1), ("a", 10, 20, 1)]]

    class Largest(MessageProcessor):
        def __init__(self, context: ProcessorContext) -> None:
            self.table = WindowedTable(context, "windows", Sliding(5, grace=60), reduce(max))
            self.results: list[Any] = []

        def process(self, messages: list[Message], sender: Sender) -> None:
            self.results += self.table.update((m.key, m.timestamp, m.value) for m in messages)

    sliding = ProcessorDriver(Largest, stores=[MemoryTable("windows")])
    sliding.process([make_message("in", v, "A", timestamp=t)
                     for v, t in ((1, 8000), (2, 9200), (3, 12400))])
    last = {(r.start, r.end): r.value for r in processor_of(sliding).results}
    # Kafka Streams: [3000;8000] [4200;9200] [7400;12400] [8001;13001] [9201;14201]
    assert last == {(3000, 8001): 1, (4200, 9201): 2, (7400, 12401): 3,
                    (8001, 13002): 3, (9201, 14202): 3}
    assert sum_of(lambda v: v["n"]).fold(0, [{"n": 2}, {"n": 3}]) == 5


# -- the join ---------------------------------------------------------------------------

class Joined(MessageProcessor):
    """Joins topic "left" with topic "right" within 10 ms, 5 ms of grace."""

    def __init__(self, context: ProcessorContext, how: Any = "inner") -> None:
        self.join = StreamJoin(context, "join", within=0.01, grace=0.005, how=how)
        self.results: list[Any] = []

    def process(self, messages: list[Message], sender: Sender) -> None:
        sides = {topic: [(m.key, m.timestamp, m.value) for m in messages if m.topic == topic]
                 for topic in ("left", "right")}
        self.results += [tuple(r) for r in self.join.join(sides["left"], sides["right"])]


def side(topic: str, key: str, value: str, at: int) -> Message:
    return make_message(topic, value, key, timestamp=at)


def test_inner_join_pairs_records_within_the_difference() -> None:
    """Pairs within 10 ms join in either arrival order (timestamp: the later one);
    records 11 ms apart or of other keys do not."""
    driver = ProcessorDriver(Joined, stores=[MemoryTable("join")])
    driver.process([side("left", "k", "L1", 100), side("right", "k", "R1", 110),
                    side("right", "x", "Rx", 100)])
    driver.process([side("left", "k", "L2", 121), side("right", "k", "R2", 95)])
    assert processor_of(driver).results == [("k", "L1", "R1", 110), ("k", "L1", "R2", 100)]


def test_left_join_sends_unmatched_left_records_once_they_can_no_longer_join() -> None:
    """A left record with no right record within 10 ms comes out with None once stream
    time passes its time + 2 * within + grace (not before); a matched one never does."""
    driver = ProcessorDriver(lambda c: Joined(c, "left"), stores=[MemoryTable("join")])
    driver.process([side("left", "k", "L1", 100), side("left", "k", "L2", 105),
                    side("right", "k", "R2", 113)])
    assert processor_of(driver).results == [("k", "L2", "R2", 113)]
    driver.process([side("right", "k", "R0", 120)])  # 15 and 20 ms away: no join
    assert processor_of(driver).results == [("k", "L2", "R2", 113)]
    driver.process([side("right", "k", "R3", 126)])  # 126 = 100 + 2 * 10 + 5 + 1
    assert processor_of(driver).results[1:] == [("k", "L1", None, 100)]
    driver.process([side("right", "k", "R4", 400)])
    assert processor_of(driver).results[2:] == []  # L2 was matched: never sent with None


def test_join_drops_late_records_and_expires_its_buffers() -> None:
    """A record more than within + grace behind stream time is dropped and counted; once
    stream time moves on, both sides' buffered records leave the store."""
    driver = ProcessorDriver(Joined, stores=[MemoryTable("join")])
    driver.process([side("left", "k", "L1", 100), side("right", "k", "R1", 200)])
    driver.process([side("right", "k", "R-late", 104)])  # 200 > 104 + 15: late
    assert processor_of(driver).results == []
    assert processor_of(driver).join.late_records == 1
    driver.process([side("left", "z", "Lz", 1000)])
    entries = {key[:1] for key in dict(driver.store("join").items())}  # type: ignore[attr-defined]
    assert entries == {b"m", b"a"}  # only Lz is buffered
