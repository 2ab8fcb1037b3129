"""An ``ArrowMessageProcessor`` in a Spark task (``run_task``, no Spark): its records stay
columnar and ``process_table`` gets the table the live loop's ``to_arrow`` builds from
the same records; a raising ``process_table`` fails naming the batch with nothing
produced; records the columnar path does not cover take the loop's decoder."""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

import pytest
from test_reprocess_task import FakeProducer

from kasper_py import Config, ProcessingError, Sender, SerdeError
from kasper_py.kafka.batching import decode_batch
from kasper_py.message import Message
from kasper_py.spark.records import MessageReader, TableReader, messages_of, reader_for
from kasper_py.spark.task import COLUMNS, TaskSpec, run_task

pa = pytest.importorskip("pyarrow")
from kasper_py.arrow import ArrowMessageProcessor, TableBatch, to_arrow  # noqa: E402


class Tables(ArrowMessageProcessor):
    """Keeps each table; sends ``doubled`` per row as JSON bytes keyed by ``user``; a
    negative amount raises."""

    tables: ClassVar[list[Any]] = []

    def process_table(self, table: Any, sender: Sender) -> None:
        Tables.tables.append(table)
        rows = table.to_pylist()
        if any(row["amount"] < 0 for row in rows):
            raise ValueError("negative amount")
        sender.send_many("out", [(row["user"], json.dumps({"doubled": 2 * row["amount"]})
                                  .encode(), None, None) for row in rows])


class Handed(Tables):
    """The same with a ``process()`` of its own, which notes what it was handed."""

    handed: ClassVar[list[Any]] = []

    def process(self, messages: list[Message], sender: Sender) -> None:
        Handed.handed.append(messages)
        super().process(messages, sender)


def records(amounts: list[int], keys: list[bytes] | None = None) -> Any:
    """Spark's Arrow rows of JSON events on t[0]; offset 1 has no timestamp."""
    count = len(amounts)
    return pa.RecordBatch.from_pydict(dict(zip(COLUMNS, [
        ["t"] * count, [0] * count, list(range(count)),
        keys or [b"u%d" % (n % 2) for n in range(count)],
        [json.dumps({"user": f"u{n % 2}", "amount": a}).encode() for n, a in enumerate(amounts)],
        [1000 + n for n in range(count)], [-1 if n == 1 else 0 for n in range(count)],
        [None] * count], strict=True)))


def run(factory: Any, batches: list[Any], log: list[Any] | None = None, **config: Any
        ) -> list[Any]:
    Tables.tables.clear()
    Handed.handed.clear()
    values = {"key_serde": "str", "value_serde": "bytes", "batch_size": 3, **config}
    cfg = Config(name="unit", bootstrap_servers="in-memory:0", input_topics=("t",), **values)
    producer = FakeProducer([] if log is None else log)
    rows = list(run_task(TaskSpec(cfg, lambda _context: factory()), batches, None,
                         lambda _config: producer))
    return [row for batch in rows for row in batch.to_pylist()]


def test_records_stay_columnar_and_give_the_loops_table(monkeypatch) -> None:
    """Batches of 3 across Arrow batches of 2 and 5: each table equals ``to_arrow`` of the
    same records decoded as the loop decodes them (keys text, values JSON bytes, a
    missing timestamp null); no message was built; outputs and ranges as usual."""
    def no_messages(_batch: Any) -> Any:
        raise AssertionError("a columnar batch was turned into messages")

    amounts = [5, 6, 7, 8, 9, 10, 11]
    whole = records(amounts)
    cfg = Config(name="u", bootstrap_servers="x:1", input_topics=("t",), key_serde="str")
    messages = decode_batch(messages_of(whole), cfg.key_decoder,
                            cfg.value_decoder).by_partition[0]
    monkeypatch.setattr(TableBatch, "messages", no_messages)
    log: list[Any] = []
    rows = run(Tables, [whole.slice(0, 2), whole.slice(2)], log)
    expected = [to_arrow(messages[begin:begin + 3]) for begin in (0, 3, 6)]
    assert Tables.tables == expected
    assert expected[0].column("timestamp").to_pylist() == [1000, None, 1002]
    produced = [m for entry in log if entry[0] == "produce" for m in entry[1]]
    assert [(m.key, json.loads(m.value)) for m in produced] == [
        (b"u%d" % (n % 2), {"doubled": 2 * a}) for n, a in enumerate(amounts)]
    assert produced[0].timestamp == 1002  # the batch's newest timestamp, as in the loop
    assert rows[0]["messages"] == 7 and rows[0]["batches"] == 3
    assert json.loads(rows[0]["ranges"]) == {"t": [0, 6]}


def test_a_raising_process_table_fails_the_task_naming_the_batch() -> None:
    """The second batch raises: ProcessingError naming partition, offsets and cause; the
    producer is closed discarding what was queued."""
    with pytest.raises(ProcessingError) as info:
        run(Tables, [records([1, 2, 3, 4, -5, 6])], log := [])
    assert ("process() of partition 0 raised ValueError: negative amount (t[0] offsets 3..5)"
            in str(info.value))
    assert [entry[0] for entry in log] == ["produce", "close"]
    assert log[-1] == ("close", "discard")


def test_what_the_columnar_path_does_not_cover_takes_the_loops_decoder() -> None:
    """A key that is not UTF-8 fails as the loop's str serde does; a processor with its
    own process() gets decoded messages; another value or key serde, or dead letters of
    failed batches, choose the loop's decoder too; the json serde and several topics
    stay columnar."""
    with pytest.raises(SerdeError, match=r"decode t\[0\] offset 1: str serde: invalid UTF-8"):
        run(Tables, [records([1, 2], keys=[b"ok", b"\xff"])])
    run(Handed, [records([1, 2])])
    assert [type(given) for given in Handed.handed] == [list]
    assert Tables.tables[0].column("key").to_pylist() == ["u0", "u1"]
    base = {"name": "u", "bootstrap_servers": "x:1", "input_topics": ("t",), "key_serde": "str"}
    columnar = [Config(**base), Config(**{**base, "key_serde": "bytes"}),
                Config(**{**base, "value_serde": "json"}),
                Config(**{**base, "input_topics": ("t", "u")})]
    decoded = [Config(**{**base, "value_serde": "str"}),
               Config(**{**base, "key_serde": "json"}),
               Config(**{**base, "on_process_error": "dead_letter",
                         "dead_letter_topic": "dlq"})]
    assert [type(reader_for(cfg, Tables())) for cfg in columnar] == [TableReader] * 4
    assert [type(reader_for(cfg, Tables())) for cfg in decoded] == [MessageReader] * 3
    assert type(reader_for(columnar[0], Handed())) is MessageReader


class Kept(ArrowMessageProcessor):
    """Keeps each table; sends nothing."""

    tables: ClassVar[list[Any]] = []

    def process_table(self, table: Any, sender: Sender) -> None:
        Kept.tables.append(table)


def spark_rows(entries: list[tuple[str, int, bytes]]) -> Any:
    """Spark's Arrow rows of partition 0: (topic, offset, value) each, in that order."""
    count = len(entries)
    return pa.RecordBatch.from_pydict(dict(zip(COLUMNS, [
        [topic for topic, _, _ in entries], [0] * count, [offset for _, offset, _ in entries],
        [b"k%d" % offset for _, offset, _ in entries], [value for _, _, value in entries],
        [1000 + offset for _, offset, _ in entries], [0] * count, [None] * count],
        strict=True)))


def loops_tables(entries: list[tuple[str, int, bytes]], size: int, **config: Any) -> list[Any]:
    """The tables the live loop's ``to_arrow`` gives for the same records decoded by its
    decoder (``decode_batch``), ``size`` records a batch."""
    cfg = Config(name="u", bootstrap_servers="x:1", input_topics=("t", "u"), key_serde="str",
                 **config)
    tables = []
    for begin in range(0, len(entries), size):
        read = messages_of(spark_rows(entries[begin:begin + size]))
        tables.append(to_arrow(decode_batch(read, cfg.key_decoder,
                                            cfg.value_decoder).by_partition[0]))
    return tables


def run_kept(entries: list[tuple[str, int, bytes]], size: int, **config: Any) -> list[Any]:
    Kept.tables.clear()
    values = {"key_serde": "str", "batch_size": size, **config}
    cfg = Config(name="unit", bootstrap_servers="in-memory:0", input_topics=("t", "u"),
                 **values)
    rows = list(run_task(TaskSpec(cfg, lambda _context: Kept()), [spark_rows(entries)], None,
                         lambda _config: FakeProducer([])))
    return [row for batch in rows for row in batch.to_pylist()]


JSON_EVENTS = [b'{"user":"a","n":1}', b'{"user":"b","n":2.5,"tags":["x"]}',
               b'{"user":"c","extra":{"deep":true,"z":null}}', b'{"n":3,"user":"caf\\u00e9"}',
               b'{"user":"d","tags":[]}', b'{"user":"e","n":-0.0}']


def test_json_serde_values_stay_columnar_and_give_the_loops_table(monkeypatch) -> None:
    """With the json serde, Arrow's reader over the raw bytes gives each batch the very
    table the loop builds from the serde's dicts (fields missing from some rows, nested
    values, lists, escapes, floats); no message is built."""
    def no_messages(_batch: Any) -> Any:
        raise AssertionError("a columnar batch was turned into messages")

    monkeypatch.setattr(TableBatch, "messages", no_messages)
    entries = [("t", offset, value) for offset, value in enumerate(JSON_EVENTS)]
    run_kept(entries, 4, value_serde="json")
    assert Kept.tables == loops_tables(entries, 4, value_serde="json")
    assert Kept.tables[0].column("extra").to_pylist()[2] == {"deep": True, "z": None}


@pytest.mark.parametrize("odd", [
    b'{"user":"f","day":"2026-11-27"}',  # Arrow's reader would make the day a timestamp
    b'{"user":"f","n":12345678901234567890123}',  # beyond int64: the reader, a double
    b'{"user":"f"} {"user":"g"}',  # two objects in one value
    b'["not", "an", "object"]',
], ids=["date-like-text", "long-integer", "two-objects", "array"])
def test_json_serde_values_arrow_could_read_otherwise_take_the_loops_decoder(
        odd: bytes) -> None:
    """A batch holding a value whose table from Arrow's reader might not be the serde's
    is decoded as the loop decodes it: the same table, or the same error."""
    entries = [("t", 0, b'{"user":"a","n":1}'), ("t", 1, odd)]
    try:
        expected = loops_tables(entries, 2, value_serde="json")
    except SerdeError as exc:  # the loop's decoder refuses it: so does the task's
        with pytest.raises(SerdeError, match=re.escape(str(exc))):
            run_kept(entries, 2, value_serde="json")
        return
    except Exception as exc:  # the loop's to_arrow refuses it: so does the task's turn
        with pytest.raises(ProcessingError) as failed:
            run_kept(entries, 2, value_serde="json")
        assert type(failed.value.__cause__) is type(exc)
        return
    run_kept(entries, 2, value_serde="json")
    assert Kept.tables == expected


def test_json_serde_values_that_do_not_decode_follow_the_decode_policy() -> None:
    """Invalid JSON or UTF-8 fails naming the offset, as the loop's serde does; with
    ``on_decode_error="skip"`` the others are processed and the offset counted."""
    for bad in (b'{"user": nope}', b'{"user":"\xff"}'):
        entries = [("t", 0, b'{"user":"a"}'), ("t", 1, bad)]
        with pytest.raises(SerdeError, match=r"cannot decode t\[0\] offset 1: json serde"):
            run_kept(entries, 2, value_serde="json")
        [stats] = run_kept(entries, 2, value_serde="json", on_decode_error="skip")
        assert Kept.tables[0].column("user").to_pylist() == ["a"]
        assert (stats["messages"], stats["undecodable"]) == (2, 1)


@pytest.mark.parametrize("serde", ["bytes", "json"])
def test_several_topics_stay_columnar_topic_by_topic(serde: str, monkeypatch) -> None:
    """Interleaved records of two topics (Spark orders them by time) become one table
    grouped topic by topic, each in offset order, as the loop's decoder groups them;
    each topic's range is its own."""
    def no_messages(_batch: Any) -> Any:
        raise AssertionError("a columnar batch was turned into messages")

    monkeypatch.setattr(TableBatch, "messages", no_messages)
    entries = [("u", 0, b'{"view":1}'), ("t", 0, b'{"click":1}'), ("u", 1, b'{"view":2}'),
               ("t", 1, b'{"click":2}'), ("t", 2, b'{"click":3}')]
    [stats] = run_kept(entries, 5, value_serde=serde)
    [table] = Kept.tables
    assert table == loops_tables(entries, 5, value_serde=serde)[0]
    assert table.select(["topic", "offset", "view", "click"]).to_pylist() == [
        {"topic": "u", "offset": 0, "view": 1, "click": None},
        {"topic": "u", "offset": 1, "view": 2, "click": None},
        {"topic": "t", "offset": 0, "view": None, "click": 1},
        {"topic": "t", "offset": 1, "view": None, "click": 2},
        {"topic": "t", "offset": 2, "view": None, "click": 3}]
    assert json.loads(stats["ranges"]) == {"t": [0, 2], "u": [0, 1]}
