"""Columnar batches: ``to_arrow`` (decoded and undecoded JSON values, plain values),
``send_table`` from an Arrow table, and ``ArrowMessageProcessor`` in the testing driver,
its failure leaving the batch uncommitted."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kasper_py import JSON, STRING, Config, ProcessingError, Sender
from kasper_py.testing import ProcessorDriver, make_message

pa = pytest.importorskip("pyarrow")
from kasper_py.arrow import ArrowMessageProcessor, send_table, to_arrow  # noqa: E402


def events(values: list[Any], serialise: bool = False) -> list[Any]:
    return [make_message("in", json.dumps(v).encode() if serialise else v, key=f"k{n}",
                         offset=n, timestamp=1000 + n) for n, v in enumerate(values)]


@pytest.mark.parametrize("serialise", [False, True], ids=["decoded", "json-bytes"])
def test_json_fields_become_columns(serialise: bool) -> None:
    """Decoded dicts and undecoded JSON bytes give the same columns, a missing field
    null, after the message's own columns."""
    table = to_arrow(events([{"user": "a", "amount": 2}, {"user": "b"}], serialise))
    assert table.column_names == ["topic", "partition", "offset", "timestamp", "key",
                                  "user", "amount"]
    assert table.to_pylist() == [
        {"topic": "in", "partition": 0, "offset": 0, "timestamp": 1000, "key": "k0",
         "user": "a", "amount": 2},
        {"topic": "in", "partition": 0, "offset": 1, "timestamp": 1001, "key": "k1",
         "user": "b", "amount": None}]


def test_plain_values_are_one_column_and_clashing_fields_are_renamed() -> None:
    assert to_arrow(events(["x", "y"])).column("value").to_pylist() == ["x", "y"]
    table = to_arrow(events([{"key": 1, "offset": 2}]))
    assert table.column("value.key").to_pylist() == [1]
    assert table.column("value.offset").to_pylist() == [2]
    assert table.column("key").to_pylist() == ["k0"]


def test_a_batch_of_two_topics_keeps_each_rows_topic_and_partition() -> None:
    """Co-partitioned inputs share a batch: the topic column is per row, not the first's."""
    messages = [make_message("clicks", {"n": 1}, offset=4, partition=2),
                make_message("views", {"n": 2}, offset=9, partition=2)]
    table = to_arrow(messages)
    assert table.column("topic").to_pylist() == ["clicks", "views"]
    assert table.column("partition").to_pylist() == [2, 2]
    assert table.column("offset").to_pylist() == [4, 9]


@pytest.mark.parametrize("values", [
    [b'{"a": 1}', b'{"a":\n 2}'],  # a line break inside a value: not one row per line
    [b'{"a": 1}', b"[1]"],  # a value that is not an object
    [b'{"a": 1}', None],  # a tombstone
], ids=["multi-line", "array", "tombstone"])
def test_bytes_that_are_not_one_object_per_line_stay_one_value_column(
        values: list[bytes | None]) -> None:
    """Arrow's JSON reader is used only when every value is one object on one line;
    otherwise the bytes are kept as they are, row for row, none lost."""
    table = to_arrow(events(values))
    assert table.column("value").to_pylist() == values
    assert table.num_rows == len(values)


class SumPerUser(ArrowMessageProcessor):
    """Sum and count of ``amount`` per ``user`` in each batch, sent from a table."""

    def process_table(self, table: Any, sender: Sender) -> None:
        if "fail" in table.column_names:
            raise ValueError("cannot sum")
        totals = table.group_by("user").aggregate([("amount", "sum"), ("amount", "count")])
        send_table(sender, "totals", totals.sort_by("user"), key="user")


def test_an_arrow_processor_in_the_driver() -> None:
    """The batch's sums and counts per key, sent one message per row keyed by user."""
    config = Config(name="sums", bootstrap_servers="in-memory", input_topics=["in"],
                    key_serde="str", value_serde="json")
    driver = ProcessorDriver(SumPerUser, config=config)
    driver.process(events([{"user": "a", "amount": 2}, {"user": "b", "amount": 5},
                           {"user": "a", "amount": 3}]))
    assert driver.outputs("totals") == [("a", {"amount_sum": 5, "amount_count": 2}),
                                        ("b", {"amount_sum": 5, "amount_count": 1})]
    assert driver.committed == {("in", 0): 3}
    with pytest.raises(ProcessingError, match="raised ValueError: cannot sum"):
        driver.process([make_message("in", {"fail": 1}, key="k", offset=3)])
    assert driver.committed == {("in", 0): 3}


def test_send_table_takes_a_frame_with_to_arrow_and_chosen_columns() -> None:
    """Anything with ``to_arrow()`` (a Polars frame) is sent; ``value`` picks columns."""

    class Frame:
        def to_arrow(self) -> Any:
            return pa.table({"user": ["a"], "n": [1], "skip": [0]})

    sender = Sender(STRING, JSON)
    send_table(sender, "out", Frame(), key="user", value=["n"])
    [message] = sender.messages
    assert (message.topic, message.key, json.loads(message.value)) == ("out", b"a", {"n": 1})


def test_send_table_takes_a_real_polars_frame() -> None:
    """A Polars frame is sent row by row in its order, its key column as the key."""
    import polars as pl  # the dev install has the polars extra: a missing install fails here
    frame = pl.DataFrame({"user": ["a", "b"], "total": [3, 5]})
    sender = Sender(STRING, JSON)
    send_table(sender, "out", frame, key="user")
    sent = [(m.topic, m.key, json.loads(m.value)) for m in sender.messages]
    assert sent == [("out", b"a", {"total": 3}), ("out", b"b", {"total": 5})]


@pytest.mark.parametrize("columns", [
    {"n": [1, -2, None, 2**62], "ok": [True, False, None, True],
     "name": ["plain text", "", None, "~!#[]"]},
    {"x": [0.1, 1.0, 1e20, None]},
    {"name": ['a "quoted" word', "back\\slash", "caf\u00e9", "tab\there"]},
    {"nested": [{"a": 1}, None, {"a": 2}, {"a": None}]},
], ids=["arrow-encoded", "floats", "escaped-text", "nested"])
def test_send_table_with_the_json_serde_gives_the_serdes_bytes(columns: dict[str, Any]) -> None:
    """Whether Arrow encodes the rows (integers, booleans, plain text, nulls) or the
    serde does (floats, text needing escapes, nested values), each value is the bytes
    the json serde gives for the row's dict."""
    table = pa.table({"user": ["u0", "u1", "u2", "u3"], **columns})
    sender = Sender(STRING, JSON)
    send_table(sender, "out", table, key="user")
    rows = table.select(list(columns)).to_pylist()
    assert [(m.key, m.value) for m in sender.messages] == [
        (f"u{n}".encode(), JSON.encode(row)) for n, row in enumerate(rows)]
