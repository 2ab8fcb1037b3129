"""Sender: buffers encoded messages in order and refuses what it cannot encode."""

from __future__ import annotations

import pytest

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
