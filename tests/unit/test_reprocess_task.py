"""What a Spark task does with Arrow batches of Kafka records, without Spark or a broker:
batches of batch_size across Arrow batch boundaries, one processor per partition, the
loop's order with stores, headers/timestamps/serdes, and errors naming offsets."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterable
from typing import Any, ClassVar

import pytest

from kasper_py import (
    AsyncMessageProcessor,
    Config,
    Message,
    MessageProcessor,
    OffsetError,
    ProcessingError,
    Sender,
    SerdeError,
    StoreError,
)
from kasper_py.message import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    TIMESTAMP_NONE,
    OutgoingMessage,
    OutgoingRecord,
)
from kasper_py.processor import ProcessorContext
from kasper_py.spark.task import COLUMNS, PartitionStats, TaskSpec, run_task
from kasper_py.stores.memory import MemoryTable
from kasper_py.testing import ProcessorDriver, make_message
from kasper_py.windows import Deduplicator

pa = pytest.importorskip("pyarrow")


class FakeProducer:
    """Records what was produced and when acks were awaited."""

    def __init__(self, log: list[Any]) -> None:
        self.log = log

    def produce(self, messages: Iterable[OutgoingRecord]) -> None:
        self.log.append(("produce", [OutgoingMessage.of(m) for m in messages]))

    def wait_for_acks(self, waiting: Any = None) -> None:
        self.log.append(("acks",))

    def missing_topics(self, topics: Any) -> dict[str, str]:
        return {}

    def close(self, discard: bool = False) -> None:
        self.log.append(("close", "discard") if discard else ("close",))


class Recorder(MessageProcessor):
    """Keeps every batch it was given; echoes each value upper-cased to ``out``."""

    instances: ClassVar[list[Recorder]] = []

    def __init__(self, context: ProcessorContext) -> None:
        self.partition = context.partition
        self.batches: list[list[Message]] = []
        self.closed = False
        self.store = context.stores.get("seen")
        Recorder.instances.append(self)

    def process(self, messages: list[Message], sender: Sender) -> None:
        self.batches.append(messages)
        for m in messages:
            if m.value in ("boom", b"boom"):
                raise ValueError("boom")
            sender.send("out", m.value.upper(), key=m.key)
        if self.store is not None:
            self.store.put(len(self.batches), [m.offset for m in messages])

    def close(self) -> None:
        self.closed = True


def arrow(rows: list[tuple[Any, ...]]) -> Any:
    """An Arrow batch of COLUMNS from (topic, partition, offset, value[, headers]) rows."""
    columns: dict[str, list[Any]] = {name: [] for name in COLUMNS}
    for topic, partition, offset, value, *headers in rows:
        kind = {3: -1, 4: 1}.get(offset, 0)  # Spark's timestampType: none, log-append, create
        values = [topic, partition, offset, b"k%d" % offset, value, 1000 + offset,
                  kind, headers[0] if headers else None]
        for name, cell in zip(COLUMNS, values, strict=True):
            columns[name].append(cell)
    return pa.RecordBatch.from_pydict(columns)


def run(batches: list[Any], *, batch_size: int = 3, topics: tuple[str, ...] = ("t",),
        stores: tuple[Any, ...] = (), output: str = "kafka", factory: Any = Recorder,
        **config: Any) -> tuple[list[dict[str, Any]], list[Any], list[PartitionStats]]:
    Recorder.instances.clear()
    cfg = Config(name="unit", bootstrap_servers="in-memory:0", input_topics=topics,
                 batch_size=batch_size, **config)
    spec = TaskSpec(cfg, factory, stores, output)
    log: list[Any] = []
    reported: list[PartitionStats] = []
    results = list(run_task(spec, batches, reported.extend, lambda _c: FakeProducer(log)))
    rows = [row for batch in results for row in batch.to_pylist()]
    return rows, log, reported


def test_batches_of_batch_size_span_arrow_batches() -> None:
    """7 records in Arrow batches of 2 and 5 reach process() as 3, 3, 1; acks at the end."""
    rows, log, reported = run([arrow([("t", 0, o, b"v%d" % o) for o in range(2)]),
                               arrow([("t", 0, o, b"v%d" % o) for o in range(2, 7)])])
    (processor,) = Recorder.instances
    assert [[m.offset for m in b] for b in processor.batches] == [[0, 1, 2], [3, 4, 5], [6]]
    assert processor.closed
    assert [entry[0] for entry in log] == ["produce"] * 3 + ["acks", "close"]
    assert [m.value for m in log[0][1]] == [b"V0", b"V1", b"V2"]
    assert len(rows) == 1 and rows[0]["messages"] == 7 and rows[0]["produced"] == 7
    assert rows[0]["batches"] == 3 and json.loads(rows[0]["ranges"]) == {"t": [0, 6]}
    assert [s.partition for s in reported] == [0]


def test_message_fields_headers_timestamps_and_serdes() -> None:
    """Keys and values go through the serdes; headers come from Spark's JSON (base64
    values, null kept); Spark's timestampType (Kafka's Java ids) becomes
    confluent-kafka's: -1 no timestamp, 0 create time, 1 log-append time."""
    headers = json.dumps([{"key": "h", "value": base64.b64encode(b"\x00\xff").decode()},
                          {"key": "n", "value": None}])
    run([arrow([("t", 0, 2, b"two", headers), ("t", 0, 3, b"three"), ("t", 0, 4, b"four")])],
        key_serde="str", value_serde="str")
    first, second, third = Recorder.instances[0].batches[0]
    assert first == Message("t", 0, 2, "k2", "two", 1002, (("h", b"\x00\xff"), ("n", None)),
                            TIMESTAMP_CREATE_TIME)
    assert second == Message("t", 0, 3, "k3", "three", None, (), TIMESTAMP_NONE)
    assert third == Message("t", 0, 4, "k4", "four", 1004, (), TIMESTAMP_LOG_APPEND_TIME)


class Timed(Recorder):
    """A Recorder with a 2 ms stream-time timer (to "ticks") and a 1 ms wall-clock one."""

    def __init__(self, context: ProcessorContext) -> None:
        super().__init__(context)
        context.schedule(0.002, lambda ts, sender: sender.send("ticks", b"%d" % ts))
        context.schedule(0.001, lambda ts, sender: sender.send("wall", b"w"), "wall_clock")


def test_stream_time_timers_fire_and_wall_clock_ones_never_in_a_spark_task() -> None:
    """Event times 1000 + offset (offset 3 has none), batches of 3: stream time reaches
    1002, 1005, 1006, and the 2 ms timer fires at each (due 0, 1004, 1006); output
    inherits its batch's newest event time. History has no wall clock: the wall-clock
    timer never fires, however long the task takes."""
    _, log, _ = run([arrow([("t", 0, o, b"v%d" % o) for o in range(7)])], factory=Timed)
    produced = [m for entry in log if entry[0] == "produce" for m in entry[1]]
    assert [(m.value, m.timestamp) for m in produced if m.topic == "ticks"] == [
        (b"1002", 1002), (b"1005", 1005), (b"1006", 1006)]
    assert [m.timestamp for m in produced if m.topic == "out"] == [1002] * 3 + [1005] * 3 + [
        1006]
    assert not [m for m in produced if m.topic == "wall"]


def test_one_processor_per_partition_in_turn() -> None:
    """Runs of partitions 0 then 1 get their own processors, each closed when its run ends."""
    rows, _, _ = run([arrow([("t", 0, 0, b"a"), ("t", 0, 1, b"b"), ("t", 1, 0, b"c")]),
                      arrow([("t", 1, 1, b"d")])])
    assert [(p.partition, [[m.value for m in b] for b in p.batches])
            for p in Recorder.instances] == [(0, [[b"a", b"b"]]), (1, [[b"c", b"d"]])]
    assert all(p.closed for p in Recorder.instances)
    assert [(r["partition"], r["messages"]) for r in rows] == [(0, 2), (1, 2)]


def test_partition_seen_twice_in_a_task_fails() -> None:
    """A partition's records split in two runs would split its state: OffsetError."""
    with pytest.raises(OffsetError, match="partition 0 reached this task in two separate runs"):
        run([arrow([("t", 0, 0, b"a"), ("t", 1, 0, b"b"), ("t", 0, 1, b"c")])])


def test_offsets_going_backwards_fail() -> None:
    """Within a partition each topic's offsets must increase, across batches too."""
    with pytest.raises(OffsetError, match=r"t\[0\] offsets are not increasing"):
        run([arrow([("t", 0, 5, b"a"), ("t", 0, 6, b"b")]), arrow([("t", 0, 4, b"c")])],
            batch_size=2)


def test_several_topics_are_grouped_topic_by_topic() -> None:
    """A batch interleaving two topics reaches process() topic by topic, in order of
    first appearance, as the loop's batches do."""
    run([arrow([("a", 0, 0, b"1"), ("b", 0, 0, b"2"), ("a", 0, 1, b"3"), ("b", 0, 1, b"4")])],
        batch_size=4, topics=("a", "b"))
    (batch,) = Recorder.instances[0].batches
    assert [(m.topic, m.offset) for m in batch] == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]


def test_stores_flush_every_batch_and_output_stores_discards() -> None:
    """With stores, each batch is flushed with its next offsets and acked before the next;
    output='stores' produces nothing and counts what it discarded."""
    table = MemoryTable("seen")
    rows, log, _ = run([arrow([("t", 0, o, b"v") for o in range(5)])], batch_size=2,
                       stores=(table,), output="stores")
    store = table.partitions[0]
    assert store.flushes == 3 and dict(store.items()) == {1: [0, 1], 2: [2, 3], 3: [4]}
    assert [entry[0] for entry in log] == ["acks"] * 4 + ["close"]
    assert rows[0]["produced"] == 0 and rows[0]["discarded"] == 5


def test_processor_error_names_partition_and_offsets() -> None:
    """process() raising becomes a ProcessingError naming the batch; processors close."""
    with pytest.raises(ProcessingError) as info:
        run([arrow([("t", 0, 0, b"ok"), ("t", 0, 1, b"ok"), ("t", 0, 2, b"boom")])])
    assert "process() of partition 0 raised ValueError: boom (t[0] offsets 0..2)" in str(
        info.value)
    assert Recorder.instances[0].closed


def test_empty_task_yields_no_rows() -> None:
    """A task given no records returns no stats (Spark needs no empty, column-less batch)."""
    rows, log, reported = run([])
    assert rows == [] and reported == [] and log == [("close",)]


def test_undecodable_records_are_set_aside_as_the_loop_does() -> None:
    """With on_decode_error='dead_letter', a record that does not decode skips process(),
    goes to the dead-letter topic with its bytes, and still counts in the batch's offsets;
    with the default policy the task fails naming the record."""
    rows, log, _ = run([arrow([("t", 0, 0, b'"a"'), ("t", 0, 1, b"{bad"), ("t", 0, 2, b'"b"')])],
                       value_serde="json", on_decode_error="dead_letter",
                       dead_letter_topic="t-dlq")
    (processor,) = Recorder.instances
    assert [[m.offset for m in b] for b in processor.batches] == [[0, 2]]
    (_, produced), *_ = log
    dead = [m for m in produced if m.topic == "t-dlq"]
    assert [(m.key, m.value) for m in dead] == [(b"k1", b"{bad")]
    assert [m.value for m in produced if m.topic == "out"] == [b'"A"', b'"B"']
    assert ("kasper.source.offset", b"1") in (dead[0].headers or ())
    assert rows[0]["messages"] == 3 and rows[0]["undecodable"] == 1
    assert json.loads(rows[0]["ranges"]) == {"t": [0, 2]}
    with pytest.raises(SerdeError, match=r"cannot decode t\[0\] offset 1: json serde"):
        run([arrow([("t", 0, 0, b"1"), ("t", 0, 1, b"{bad")])], value_serde="json")


class TrackedTable(MemoryTable):
    """A MemoryTable whose stores note when they are closed (and can be effectively-once)."""

    def __init__(self, name: str, closed: list[str], effectively_once: bool = False) -> None:
        super().__init__(name)
        self.closed, self.exact = closed, effectively_once

    def open(self, runtime: Any) -> Any:
        store = super().open(runtime)
        store.effectively_once = self.exact
        store.close = lambda: self.closed.append(self.name)  # type: ignore[method-assign]
        return store


def test_a_factory_that_raises_closes_the_stores_and_drops_queued_output() -> None:
    """The processor cannot be built: the partition's stores are closed, the producer is
    closed discarding its queue, and the factory's error is what the task raises."""
    closed: list[str] = []
    spec = TaskSpec(Config(name="unit", bootstrap_servers="in-memory:0", input_topics=("t",)),
                    lambda _c: (_ for _ in ()).throw(RuntimeError("bad factory")),
                    (TrackedTable("a", closed), TrackedTable("b", closed)))
    log: list[Any] = []
    with pytest.raises(RuntimeError, match="bad factory"):
        list(run_task(spec, [arrow([("t", 0, 0, b"x")])], None, lambda _c: FakeProducer(log)))
    assert closed == ["a", "b"]
    assert log == [("close", "discard")]


class FailsToClose(Recorder):
    def close(self) -> None:
        raise RuntimeError("close failed too")


def test_a_failing_close_keeps_the_real_error_and_closes_the_rest() -> None:
    """process() raises and then the processor's close() raises: the task reports the
    ProcessingError, and the stores still close."""
    closed: list[str] = []
    spec = TaskSpec(Config(name="unit", bootstrap_servers="in-memory:0", input_topics=("t",)),
                    FailsToClose, (TrackedTable("seen", closed),))
    with pytest.raises(ProcessingError, match="raised ValueError: boom"):
        list(run_task(spec, [arrow([("t", 0, 0, b"boom")])], None,
                      lambda _c: FakeProducer([])))
    assert closed == ["seen"]


def test_an_effectively_once_store_must_be_alone_here_too() -> None:
    """As in the loop: an effectively-once store beside another store is refused (its
    replay skipping would starve the other), and both are closed."""
    closed: list[str] = []
    spec = TaskSpec(Config(name="unit", bootstrap_servers="in-memory:0", input_topics=("t",)),
                    Recorder, (TrackedTable("exact", closed, effectively_once=True),
                               TrackedTable("plain", closed)))
    with pytest.raises(StoreError, match="'exact' is effectively-once, so it must be the "
                                         "processor's only store"):
        list(run_task(spec, [arrow([("t", 0, 0, b"x")])], None, lambda _c: FakeProducer([])))
    assert closed == ["exact", "plain"]


def test_poison_messages_are_dead_lettered_as_the_loop_does() -> None:
    """With on_process_error='dead_letter', the task's turn finds the message process()
    fails on by bisection: it goes to the dead-letter topic with the bytes it was read
    with (JSON kept as written), the others' output is produced once."""
    rows, log, _ = run([arrow([("t", 0, 0, b'"a"'), ("t", 0, 1, b'  "boom"'),
                               ("t", 0, 2, b'"b"')])],
                       value_serde="json", on_process_error="dead_letter",
                       dead_letter_topic="t-dlq")
    produced = [m for entry in log if entry[0] == "produce" for m in entry[1]]
    assert [m.value for m in produced if m.topic == "out"] == [b'"A"', b'"B"']
    (dead,) = [m for m in produced if m.topic == "t-dlq"]
    assert (dead.key, dead.value) == (b"k1", b'  "boom"')
    headers = dict(dead.headers or ())
    assert (headers["kasper.error"], headers["kasper.error.type"],
            headers["kasper.source.offset"]) == (b"boom", b"ValueError", b"1")
    assert rows[0]["messages"] == 3


class AsyncEcho(AsyncMessageProcessor):
    """Echoes each value upper-cased to ``out`` after an await; fails on ``boom``."""

    async def process_message(self, message: Message, sender: Sender) -> None:
        await asyncio.sleep(0.001 * (5 - message.offset % 5))
        if message.value == b"boom":
            raise ValueError("boom")
        sender.send("out", message.value.upper(), key=message.key)


def test_an_async_processor_in_a_spark_task() -> None:
    """Each batch's calls are all done before its output is produced; a call that
    raises fails the task naming the partition, the offsets and the cause."""
    rows, log, _ = run([arrow([("t", 0, o, b"v%d" % o) for o in range(6)])],
                       factory=AsyncEcho)
    produced = [sorted(m.value for m in entry[1]) for entry in log if entry[0] == "produce"]
    assert produced == [[b"V0", b"V1", b"V2"], [b"V3", b"V4", b"V5"]]
    assert rows[0]["produced"] == 6
    with pytest.raises(ProcessingError, match=r"partition 0 raised ValueError: boom.*t\[0\] "
                                              r"offsets 3\.\.5"):
        run([arrow([("t", 0, o, b"boom" if o == 4 else b"v") for o in range(6)])],
            factory=AsyncEcho)


class Dedup(MessageProcessor):
    """Forwards the first record of each id (its value) within 4 ms of event time."""

    def __init__(self, context: ProcessorContext) -> None:
        self.seen = Deduplicator(context, "seen", within=0.004)

    def process(self, messages: list[Message], sender: Sender) -> None:
        for m in self.seen.first_occurrences(messages, lambda m: m.value,
                                             lambda m: m.timestamp):
            sender.send("out", m.value, key=m.key)


def test_deduplication_in_a_spark_task_drops_what_the_live_loop_drops() -> None:
    """The same records (event time 1000 + offset) deduplicated in a Spark task, in
    batches of 3 across Arrow batches, and in the loop's driver, in one batch and one
    at a time: the same records pass, each id's first within 4 ms."""
    ids = [b"a", b"b", b"a", b"c", b"a", b"b", b"a", b"c", b"c", b"a"]
    rows = [("t", 0, offset, value) for offset, value in enumerate(ids) if offset != 3]
    _, log, _ = run([arrow(rows[:4]), arrow(rows[4:])], factory=Dedup,
                    stores=(MemoryTable("seen", key_serde="bytes"),))
    spark = [(m.key, m.value) for entry in log if entry[0] == "produce" for m in entry[1]]
    # a@1002, a@1006 and c@1008 repeat a held id; a@1004 and b@1005 come as their
    # id's first + 4 ms is reached, so they pass
    expected = [(b"k0", b"a"), (b"k1", b"b"), (b"k4", b"a"), (b"k5", b"b"), (b"k7", b"c"),
                (b"k9", b"a")]
    assert spark == expected
    config = Config(name="unit", bootstrap_servers="in-memory:0", input_topics=["t"])
    messages = [make_message("t", value, b"k%d" % offset, offset=offset,
                             timestamp=1000 + offset) for _, _, offset, value in rows]
    for cuts in ([messages], [[m] for m in messages]):
        driver = ProcessorDriver(Dedup, config=config, stores=[MemoryTable("seen")])
        for batch in cuts:
            driver.process(batch, encoded=True)
        assert [(m.key, m.value) for m in driver.sent] == expected
