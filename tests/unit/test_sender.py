"""Sender: buffers encoded messages in order and refuses what it cannot encode."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kasper_py import JSON, STRING, OutgoingMessage, Sender, SerdeError


def test_buffers_in_order_with_serdes() -> None:
    """Keys and values go through the serdes; bytes pass through; order is kept."""
    sender = Sender(key_serde=STRING, value_serde=JSON)
    sender.send("out", {"n": 1}, key="k1")
    sender.send("out", b"raw", key=b"k2", partition=3, headers={"h": "v"})
    assert sender.messages == [
        OutgoingMessage("out", b'{"n":1}', b"k1", None, None),
        OutgoingMessage("out", b"raw", b"k2", 3, (("h", b"v"),)),
    ]
    assert len(sender) == 2
    assert len(sender.drain()) == 2
    assert len(sender) == 0


def test_records_are_the_producers_arguments_and_read_back_as_sent() -> None:
    """What the sender hands the producer is produce()'s positional arguments (partition
    -1 and timestamp 0 when not given, the headers' list last when any), and
    ``OutgoingMessage.of`` gives back what was sent."""
    sender = Sender()
    sender.timestamp = 1_700_000_000_000
    sender.send("out", b"v", b"k")
    sender.send("out", None, None, 2, [("h", "x")], timestamp=42)
    sender.timestamp = None
    sender.send("out", b"w", headers={})
    records = sender.drain()
    assert records == [("out", b"v", b"k", -1, None, None, 1_700_000_000_000),
                       ("out", None, None, 2, None, None, 42, [("h", b"x")]),
                       ("out", b"w", None, -1, None, None, 0)]
    assert [OutgoingMessage.of(r) for r in records] == [
        OutgoingMessage("out", b"v", b"k", None, None, 1_700_000_000_000),
        OutgoingMessage("out", None, None, 2, (("h", b"x"),), 42),
        OutgoingMessage("out", b"w")]
    assert [OutgoingMessage.of(r).record() for r in records] == records


def test_encoding_error_names_the_topic() -> None:
    """A value the serde cannot encode raises SerdeError naming the topic."""
    sender = Sender()
    with pytest.raises(SerdeError, match="topic 'out'"):
        sender.send("out", "text, but the serde is bytes")


def test_bad_arguments_are_refused() -> None:
    """An empty topic or a negative partition is a programming error, raised at once."""
    sender = Sender()
    with pytest.raises(ValueError, match="topic"):
        sender.send("", b"x")
    with pytest.raises(ValueError, match="partition"):
        sender.send("out", b"x", partition=-2)


def test_header_values_must_be_bytes_str_or_none() -> None:
    """A header value librdkafka cannot send is refused in process(), naming the header,
    so the loop reports it as the processor's error instead of failing in produce."""
    sender = Sender()
    sender.send("t", b"v", headers={"s": "text", "b": b"\x00", "n": None})
    assert sender.messages[0].headers == (("s", b"text"), ("b", b"\x00"), ("n", None))
    with pytest.raises(ValueError, match="header 'count' must be bytes, str or None, got int"):
        sender.send("t", b"v", headers={"count": 5})


# -- a batch at once: send_many and repartition_many -----------------------------------

class OneRepartition:
    """Routes of an app whose one repartition, "by-word", is topic "app-by-word"."""

    def repartition_topic(self, name: str) -> str:
        if name != "by-word":
            raise ValueError(f"processor 'p' sends to repartition {name!r}, which it does "
                             "not declare: add it to its outputs")
        return "app-by-word"

    def to_channel(self, name: str, key: object, value: object, timestamp: int | None,
                   headers: tuple[tuple[str, bytes | None], ...]) -> None:
        raise AssertionError("no channel here")


RECORDS: list[tuple[object, object, int | None, object]] = [
    ("k1", {"n": 1}, None, None),
    ("k2", "text", 42, ()),
    (b"raw-key", b"raw-value", None, {"h": "v"}),
    ("k3", None, 7, [("a", b"1"), ("b", None)]),
    (None, 5, 0, []),
    ("ключ", ["ü"], None, (("t", "x"),)),
]


def one_by_one(sender: Sender, topic: str) -> None:
    for key, value, timestamp, headers in RECORDS:
        sender.send(topic, value, key, headers=headers, timestamp=timestamp)  # type: ignore[arg-type]


def test_send_many_buffers_what_send_gives_record_by_record() -> None:
    """A batch of (key, value, timestamp, headers) records: the same producer records as
    one send each (keys and values through the serdes, bytes as they are, partition -1
    for the partitioner, the inherited timestamp when none, headers kept, empty ones
    none), in order."""
    each, many = Sender(STRING, JSON), Sender(STRING, JSON)
    for sender in (each, many):
        sender.timestamp = 1_700_000_000_000
    one_by_one(each, "out")
    many.send_many("out", RECORDS)  # type: ignore[arg-type]
    assert many.drain() == each.drain()
    many.send_many("out", [])
    assert len(many) == 0 and many.topics == set()


def test_repartition_many_sends_what_repartition_sends_record_by_record() -> None:
    """repartition_many: the repartition's topic, each record as repartition sends it."""
    keyed = [r for r in RECORDS if r[0] is not None]
    each, many = Sender(STRING, JSON, OneRepartition()), Sender(STRING, JSON, OneRepartition())
    for key, value, timestamp, headers in keyed:
        each.repartition("by-word", value, key, headers=headers,  # type: ignore[arg-type]
                         timestamp=timestamp)
    many.repartition_many("by-word", keyed)  # type: ignore[arg-type]
    assert many.drain() == each.drain()
    assert {r[0] for r in each.drain()} <= {"app-by-word"}


def test_repartition_many_refuses_a_keyless_record_before_buffering_any() -> None:
    """A None key (nothing to partition by) refuses the whole batch, as repartition does
    the record; outside an app, or to an undeclared repartition, nothing is sent."""
    sender = Sender(STRING, JSON, OneRepartition())
    with pytest.raises(ValueError, match="repartition 'by-word' needs a key"):
        sender.repartition_many("by-word", [("a", 1, None, None), (None, 2, None, None)])
    with pytest.raises(ValueError, match="does not declare"):
        sender.repartition_many("other", [("a", 1, None, None)])
    assert len(sender) == 0
    with pytest.raises(ValueError, match="for the processors of an App"):
        Sender().repartition_many("by-word", [(b"a", b"1", None, None)])


def test_send_many_refuses_as_send_does_keeping_what_came_before() -> None:
    """A value the serde cannot encode: SerdeError naming the topic; a bad timestamp or
    topic: ValueError. The records before the refused one stay buffered (the turn fails
    and drops them, as it drops a failed process()'s sends)."""
    sender = Sender(STRING, JSON)
    with pytest.raises(SerdeError, match=r"topic 'out'.*cannot encode set"):
        sender.send_many("out", [("a", 1, None, None), ("b", {1}, None, None)])
    assert [r[2] for r in sender.drain()] == [b"a"]
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="send_many\\(\\) timestamp must be a non-negative"):
            sender.send_many("out", [("a", 1, bad, None)])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="topic"):
        sender.send_many("", [("a", 1, None, None)])
    with pytest.raises(ValueError, match="header 'n' must be bytes, str or None"):
        sender.send_many("out", [("a", 1, None, {"n": 5})])  # type: ignore[dict-item]


def test_a_topic_only_refused_sends_went_to_is_not_one_of_the_topics() -> None:
    """``topics`` holds the topics of the buffered messages only: a topic whose every
    send was refused (by the serde, a bad partition, timestamp or header) is not asked
    about by the turn, and one with a message buffered stays."""
    sender = Sender(STRING, JSON)
    sender.send("kept", 1, "k")
    refusals: list[Any] = [
        lambda: sender.send("bad-value", {1}),
        lambda: sender.send("bad-partition", 1, partition=-5),
        lambda: sender.send("bad-time", 1, timestamp=-1),
        lambda: sender.send("bad-header", 1, headers={"h": 1}),
        lambda: sender.send_many("bad-many", [("a", {1}, None, None)]),
        lambda: sender.send("kept", {1})]
    for refused in refusals:
        with pytest.raises((SerdeError, ValueError)):
            refused()
    assert sender.topics == {"kept"}
    sender.send_many("many", [("a", 1, None, None)])
    assert sender.topics == {"kept", "many"}


def test_topic_serdes_are_bound_per_topic_in_either_form() -> None:
    """A topic serde (``for_topic``) encodes each topic's records with that topic's
    serde, whether they come one by one or as a batch, and is asked once per topic."""
    asked: list[str] = []

    class PerTopic:
        name = "per-topic"

        def for_topic(self, topic: str) -> Any:
            asked.append(topic)

            class Tagged:
                name = "tagged"

                def encode(self, value: Any) -> bytes:
                    return f"{topic}:{value}".encode()

                def decode(self, data: bytes | None) -> Any:
                    return data

            return Tagged()

        def encode(self, value: Any) -> bytes:
            raise AssertionError("bound per topic, never used as it is")

        def decode(self, data: bytes | None) -> Any:
            return data

    sender = Sender(STRING, PerTopic())  # type: ignore[arg-type]
    sender.send("a", 1, "k")
    sender.send_many("b", [("k", 2, None, None), ("k", 3, None, None)])
    sender.send("a", 4, "k")
    assert [r[1] for r in sender.drain()] == [b"a:1", b"b:2", b"b:3", b"a:4"]
    assert asked == ["a", "b"]


sent_keys = st.one_of(st.none(), st.binary(max_size=3), st.text(max_size=3))
sent_values = st.one_of(st.none(), st.binary(max_size=3), st.integers(-5, 5),
                        st.text(max_size=3), st.just({1}))
sent_timestamps = st.one_of(st.none(), st.integers(0, 10), st.just(-1), st.just(True))
sent_headers = st.one_of(st.none(), st.just(()), st.just({"h": "v"}),
                         st.just((("a", b"1"), ("b", None))), st.just({"n": 5}))




def refusals(record: tuple[Any, Any, Any, Any]) -> int:
    """How many reasons to refuse ``record``: ``send`` and ``send_many`` check a record's
    fields in different orders, so a record with two says different things."""
    _, value, timestamp, headers = record
    return (value == {1}) + (timestamp is True or timestamp == -1) + (headers == {"n": 5})


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(sent_keys, sent_values, sent_timestamps, sent_headers).filter(
    lambda record: refusals(record) <= 1), min_size=1, max_size=12))
def test_send_many_is_send_record_by_record_whatever_the_records(
        records: list[tuple[Any, Any, Any, Any]]) -> None:
    """Any mix of bytes, encoded and ``None`` keys and values, timestamps given, inherited
    and bad, headers none, empty, good and bad: ``send_many`` buffers what a ``send``
    each buffers, and refuses the first refused record with the same error, keeping the
    records before it."""
    each, many = Sender(STRING, JSON), Sender(STRING, JSON)
    each.timestamp = many.timestamp = 1_700_000_000_000
    refused: list[str] = []
    try:
        for key, value, timestamp, headers in records:
            each.send("out", value, key, headers=headers, timestamp=timestamp)
    except (SerdeError, ValueError) as exc:
        refused.append(f"{type(exc).__name__}: {exc}".replace("send()", "send_many()"))
    try:
        many.send_many("out", records)
    except (SerdeError, ValueError) as exc:
        refused.append(f"{type(exc).__name__}: {exc}")
    assert len(refused) in (0, 2) and refused[:1] == refused[1:]
    assert many.drain() == each.drain()


def test_send_encoded_records_go_first_then_later_sends_in_order() -> None:
    """``send_encoded`` into an empty buffer, then ``send`` and ``send_encoded`` again:
    every record drained once, in the order sent, and a truncate back to the first
    call's records keeps exactly those (the Sender took the first list over)."""
    sender = Sender(value_serde=STRING)
    first = [("out", b"a", b"k", -1, None, None, 5), ("out", None, None, -1, None, None, 0,
                                                    [("h", b"1")])]
    sender.send_encoded("out", first)
    sender.send("out", "b", b"k2", timestamp=7)
    sender.send_encoded("other", [("other", b"c", None, -1, None, None, 9)])
    assert len(sender) == 4 and sender.topics == {"out", "other"}
    sender.truncate(2)
    assert sender.topics == {"out"}
    assert sender.drain() == [("out", b"a", b"k", -1, None, None, 5),
                              ("out", None, None, -1, None, None, 0, [("h", b"1")])]
    assert sender.drain() == []
