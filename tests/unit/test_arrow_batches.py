"""Columnar batches: ``to_arrow`` (decoded and undecoded JSON values, plain values),
``send_table`` from an Arrow table, and ``ArrowMessageProcessor`` in the testing driver,
its failure leaving the batch uncommitted."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kasper_py import BYTES, JSON, STRING, Config, ProcessingError, Sender, SerdeError
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
    {"lists": [[1, 2], [], None, [3]]},
], ids=["arrow-encoded", "floats", "escaped-text", "nested", "lists"])
@pytest.mark.parametrize("own_serde", [False, True], ids=["config-json", "topic-json"])
def test_send_table_with_the_json_serde_gives_the_serdes_bytes(
        columns: dict[str, Any], own_serde: bool) -> None:
    """Whether Arrow encodes the rows (integers, booleans, plain text, nulls) or the
    serde does (floats, text needing escapes, nested values), each value is the bytes
    the json serde gives for the row's dict: the same when json is the topic's own serde
    (``OutputTopic.value_serde``) and the processor's is bytes."""
    table = pa.table({"user": ["u0", "u1", "u2", "u3"], **columns})
    sender = (Sender(STRING, BYTES, value_serdes={"out": JSON}) if own_serde
              else Sender(STRING, JSON))
    send_table(sender, "out", table, key="user")
    rows = table.select(list(columns)).to_pylist()
    assert [(m.key, m.value) for m in sender.messages] == [
        (f"u{n}".encode(), JSON.encode(row)) for n, row in enumerate(rows)]


def test_send_table_to_a_topic_without_a_serde_for_rows_names_it() -> None:
    """With the bytes serde and no serde of the topic's own, a row is refused, naming
    the topic; a topic with its own json serde takes the same rows."""
    table = pa.table({"user": ["a"], "n": [1]})
    sender = Sender(STRING, BYTES, value_serdes={"json-out": JSON})
    with pytest.raises(SerdeError, match="cannot encode message for topic 'out': bytes serde "
                                         "cannot encode dict"):
        send_table(sender, "out", table, key="user")
    send_table(sender, "json-out", table, key="user")
    assert [(m.topic, m.value) for m in sender.messages] == [("json-out", b'{"n":1}')]


class SumPerUserOfBytes(ArrowMessageProcessor):
    """``SumPerUser`` over undecoded JSON values (``value_serde="bytes"``)."""

    def process_table(self, table: Any, sender: Sender) -> None:
        totals = table.group_by("user").aggregate([("amount", "sum")])
        send_table(sender, "totals", totals.sort_by("user"), key="user")


def test_an_arrow_processor_reading_bytes_sends_json_to_a_topic_with_its_own_serde() -> None:
    """The input stays bytes (Arrow parses it); the declared output topic's json serde
    encodes the rows, and the driver decodes them with it."""
    config = Config(name="sums", bootstrap_servers="in-memory", input_topics=["in"],
                    key_serde="str", value_serde="bytes",
                    output_topics=[{"name": "totals", "value_serde": "json"}])
    driver = ProcessorDriver(SumPerUserOfBytes, config=config)
    driver.process(events([{"user": "a", "amount": 2}, {"user": "b", "amount": 5},
                           {"user": "a", "amount": 3}], serialise=True))
    assert [(m.key, m.value) for m in driver.sent] == [
        (b"a", b'{"amount_sum":5}'), (b"b", b'{"amount_sum":5}')]
    assert driver.outputs("totals") == [("a", {"amount_sum": 5}), ("b", {"amount_sum": 5})]
    assert driver.committed == {("in", 0): 3}


def test_decoded_values_give_every_rows_fields() -> None:
    """A field the first value lacks is still a column (null where missing), as Arrow's
    JSON reader gives for the same values as bytes."""
    values = [{"a": 1}, {"a": 2, "b": True}]
    assert to_arrow(events(values)).select(["a", "b"]).to_pylist() == [
        {"a": 1, "b": None}, {"a": 2, "b": True}]
    assert to_arrow(events(values, serialise=True)).select(["a", "b"]).to_pylist() == [
        {"a": 1, "b": None}, {"a": 2, "b": True}]


@pytest.mark.parametrize(("line", "alike"), [
    (b'{"n":999999999999999999}', True),  # 18 digits: an int64 for both
    (b'{"n":9223372036854775808}', False),  # 2**63: the reader would make it a double
    (b'{"n":1000000000000000000}', False),  # 19 digits, most of them zeros
    (b'{"id":"a1234567890123456789z"}', False),  # in text too: refused, never misread
    (b'{"n":-12345678901234567.5}', True),  # 17 digits and 1: two runs, neither long
], ids=["18-digits", "2**63", "zeros", "in-text", "two-runs"])
def test_json_values_as_the_serde_refuse_any_run_of_19_digits(line: bytes, alike: bool) -> None:
    """``as_json_serde`` gives no table where a run of 19 digits might be an integer
    beyond int64 (the serde keeps it whole, the reader would not); shorter runs read."""
    from kasper_py.arrow import json_values
    table = json_values([b'{"n":1}', line], as_json_serde=True)
    assert (table is not None) is alike
    if alike:
        assert table.column(0).to_pylist()[1] == json.loads(line)[table.column_names[0]]
