"""``message_columns``: a table with fewer of the message's columns, or none (the value's
columns named as always), the same choice on an ``ArrowMessageProcessor`` in the testing
driver and in a Spark task, a name that is not a message column refused; the Spark task's
message columns taken from its Arrow records as they are."""

from __future__ import annotations

import json
from typing import Any, ClassVar

import pytest
from test_reprocess_arrow_records import Tables, records, run

from kasper_py import Config, ProcessingError, Sender
from kasper_py.testing import ProcessorDriver, make_message

pa = pytest.importorskip("pyarrow")
from kasper_py.arrow import ArrowMessageProcessor, TableBatch, send_table, to_arrow  # noqa: E402


def events(values: list[Any], serialise: bool) -> list[Any]:
    return [make_message("in", json.dumps(v).encode() if serialise else v, key=f"k{n}",
                         offset=n, timestamp=1000 + n) for n, v in enumerate(values)]


@pytest.mark.parametrize("serialise", [False, True], ids=["decoded", "json-bytes"])
def test_only_the_named_message_columns_in_their_usual_order(serialise: bool) -> None:
    """Named in any order, the message columns come in ``META_COLUMNS``' order, then the
    value's; a field named like a message column is ``value.<name>`` even when that
    message column is left out; the rows are those of the whole table."""
    messages = events([{"user": "a", "offset": 2}, {"user": "b", "offset": 3}], serialise)
    whole = to_arrow(messages)
    table = to_arrow(messages, message_columns=["key", "offset"])
    assert table.column_names == ["offset", "key", "user", "value.offset"]
    assert table == whole.select(table.column_names)
    values = to_arrow(messages, message_columns=())
    assert values.column_names == ["user", "value.offset"]
    assert values.to_pylist() == [{"user": "a", "value.offset": 2},
                                  {"user": "b", "value.offset": 3}]


def test_plain_values_and_an_empty_batch_without_message_columns() -> None:
    """Plain values are the one ``value`` column; an empty batch has no column at all."""
    assert to_arrow(events(["x", "y"], False), message_columns=()).to_pylist() == [
        {"value": "x"}, {"value": "y"}]
    empty = to_arrow([], message_columns=("offset",))
    assert (empty.column_names, empty.num_rows) == (["offset"], 0)
    assert to_arrow([], message_columns=()).column_names == []


def test_keys_that_are_all_absent_are_a_null_column_as_before() -> None:
    """No key in the batch: a column of Arrow's null type, as a list of ``None`` gives."""
    messages = [make_message("in", {"n": n}, key=None, offset=n) for n in range(3)]
    keys = to_arrow(messages).column("key")
    assert keys.type == pa.null() and keys.to_pylist() == [None, None, None]
    mixed = [make_message("in", {"n": 1}, key=None), make_message("in", {"n": 2}, key="k")]
    assert to_arrow(mixed).column("key").to_pylist() == [None, "k"]


@pytest.mark.parametrize("names", [["ofset"], "offset", ["key", "value"]],
                         ids=["misspelt", "a-string", "value"])
def test_a_name_that_is_not_a_message_column_is_refused(names: Any) -> None:
    """At the call, and where a processor declares it (its class statement)."""
    pattern = "message_columns: .* is not a message column " \
              r"\(one of topic, partition, offset, timestamp, key\)"
    with pytest.raises(ValueError, match=pattern):
        to_arrow(events([{"a": 1}], False), message_columns=names)
    with pytest.raises(ValueError, match=pattern):
        type("Misspelt", (ArrowMessageProcessor,), {"message_columns": names})


class ValuesOnly(ArrowMessageProcessor):
    """Sum of ``amount`` per ``user`` from a table of the values' columns alone."""

    message_columns = ()
    tables: ClassVar[list[Any]] = []

    def process_table(self, table: Any, sender: Sender) -> None:
        ValuesOnly.tables.append(table)
        totals = table.group_by("user").aggregate([("amount", "sum")])
        send_table(sender, "totals", totals.sort_by("user"), key="user")


def test_a_processor_of_the_values_alone_in_the_driver() -> None:
    """Its table has no message column; outputs as the whole table's processor gives;
    a failing batch (a field of another type) leaves the offset where it was."""
    config = Config(name="sums", bootstrap_servers="in-memory", input_topics=["in"],
                    key_serde="str", value_serde="bytes",
                    output_topics=[{"name": "totals", "value_serde": "json"}])
    driver = ProcessorDriver(ValuesOnly, config=config)
    ValuesOnly.tables.clear()
    driver.process(events([{"user": "a", "amount": 2}, {"user": "b", "amount": 5},
                           {"user": "a", "amount": 3}], serialise=True))
    assert ValuesOnly.tables[0].column_names == ["user", "amount"]
    assert driver.outputs("totals") == [("a", {"amount_sum": 5}), ("b", {"amount_sum": 5})]
    assert driver.committed == {("in", 0): 3}
    with pytest.raises(ProcessingError, match="raised ArrowNotImplementedError"):
        driver.process([make_message("in", b'{"user": "a", "amount": "x"}', offset=3)])
    assert driver.committed == {("in", 0): 3}


class OffsetsOnly(ArrowMessageProcessor):
    """Keeps each table, whose only message column is ``offset``."""

    message_columns = ("offset",)
    tables: ClassVar[list[Any]] = []

    def process_table(self, table: Any, sender: Sender) -> None:
        OffsetsOnly.tables.append(table)


def test_a_spark_task_gives_the_same_columns() -> None:
    """The Spark task's columnar records give the table the loop's ``to_arrow`` gives
    with the same ``message_columns``."""
    OffsetsOnly.tables.clear()
    run(OffsetsOnly, [records([5, 6, 7, 8])])
    assert [table.to_pylist() for table in OffsetsOnly.tables] == [
        [{"offset": n, "user": f"u{n % 2}", "amount": 5 + n} for n in range(3)],
        [{"offset": 3, "user": "u1", "amount": 8}]]


def test_a_spark_batch_without_keys_has_the_loops_null_key_column() -> None:
    """Records with no key: the Spark task's table has the null column the loop's
    ``to_arrow`` gives for messages without keys."""
    run(Tables, [records([1, 2], keys=[None, None])])
    keys = Tables.tables[0].column("key")
    assert keys.type == pa.null() and keys.to_pylist() == [None, None]


@pytest.mark.parametrize(("stamps", "newest"), [([5, None, 7], 7), ([None, None], None)])
def test_the_newest_timestamp_of_arrow_and_list_columns(stamps: list[Any],
                                                        newest: int | None) -> None:
    """A batch's newest timestamp skips records without one, from a list (the loop's
    columns) or an Arrow column (the Spark task's): ``None`` when none has one."""
    for column in (stamps, pa.array(stamps, pa.int64())):
        batch = TableBatch({"timestamp": column, "offset": [0] * len(stamps)}, list)
        assert batch.newest_timestamp() == newest
