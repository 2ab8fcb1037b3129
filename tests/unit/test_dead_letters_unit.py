"""The decode-error policy without a broker: which records are set aside, that their
offsets are still committed, what reaches the dead-letter topic, how the Config refuses
a policy it cannot honour, and that the Spark task sets aside exactly as the loop does."""

from __future__ import annotations

import pytest
from confluent_kafka import Message as RawMessage

from kasper_py import JSON, STRING, Config, ConfigError, SerdeError
from kasper_py.dead_letters import send_aside
from kasper_py.kafka.batching import build_batch
from kasper_py.message import TIMESTAMP_CREATE_TIME, TIMESTAMP_NONE, Undecodable
from kasper_py.sender import Sender


def raw(topic: str, partition: int, offset: int, value: bytes, *, key: bytes | None = None,
        headers: list[tuple[str, bytes]] | None = None) -> RawMessage:
    return RawMessage(topic=topic, partition=partition, offset=offset, key=key, value=value,
                      timestamp=(1, 5000 + offset), headers=headers)


def config(**kwargs: object) -> Config:
    return Config(name="dl", bootstrap_servers="unused:0", input_topics=["t"],
                  **kwargs)  # type: ignore[arg-type]


def test_set_aside_records_leave_process_but_stay_in_the_committed_ranges() -> None:
    """A bad record among good ones is left out of by_partition; a partition whose only
    record is bad has no messages at all; both ranges still cover every offset read, so
    the commit moves past them."""
    records = [raw("t", 0, 0, b"1"), raw("t", 0, 1, b"{oops", key=b"k", headers=[("trace", b"x")]),
               raw("t", 0, 2, b"3"), raw("t", 1, 7, b"not json")]
    batch = build_batch(records, STRING, JSON, set_aside=True)
    assert [(m.offset, m.value) for m in batch.by_partition[0]] == [(0, 1), (2, 3)]
    assert 1 not in batch.by_partition
    assert batch.next_offsets() == {("t", 0): 3, ("t", 1): 8}
    assert len(batch) == 4
    first, second = batch.undecodable
    assert first[:7] == ("t", 0, 1, b"k", b"{oops", 5001, (("trace", b"x"),))
    assert first.error.startswith("json serde: invalid JSON")
    assert second[:3] == ("t", 1, 7) and second.value == b"not json"


def test_fail_policy_raises_naming_the_record_and_the_option() -> None:
    """Without set_aside, the first bad record raises SerdeError naming topic, partition,
    offset, the serde's complaint and the policy that would let the loop go on."""
    with pytest.raises(SerdeError) as info:
        build_batch([raw("t", 3, 41, b"{")], STRING, JSON)
    text = str(info.value)
    assert text.startswith("cannot decode t[3] offset 41: json serde: invalid JSON")
    assert "on_decode_error='fail'" in text


def test_dead_letter_keeps_the_original_bytes_and_says_why() -> None:
    """The dead-letter message carries the input's key and value bytes unchanged, its
    headers first, then the error and the source coordinates."""
    record = Undecodable("t", 2, 9, b"\xffkey", b"\x00raw", 1234, (("trace", b"x"),),
                         TIMESTAMP_CREATE_TIME, "json serde: invalid JSON: boom")
    sender = Sender(STRING, JSON)
    send_aside([record.dead_letter()], config(on_decode_error="dead_letter",
                                             dead_letter_topic="t-dlq"), sender)
    (message,) = sender.messages
    assert (message.topic, message.key, message.value, message.partition) == (
        "t-dlq", b"\xffkey", b"\x00raw", None)
    assert message.headers == (
        ("trace", b"x"),
        ("kasper.error", b"json serde: invalid JSON: boom"),
        ("kasper.error.type", b"SerdeError"),
        ("kasper.processor", b"dl"),
        ("kasper.source.topic", b"t"),
        ("kasper.source.partition", b"2"),
        ("kasper.source.offset", b"9"),
        ("kasper.source.timestamp", b"1234"),
    )


def test_skip_sends_nothing() -> None:
    """The skip policy only logs: nothing is buffered for output."""
    sender = Sender()
    record = Undecodable("t", 0, 1, None, b"x", None, (), TIMESTAMP_NONE, "bad")
    send_aside([record.dead_letter()], config(on_decode_error="skip"), sender)
    assert len(sender) == 0


@pytest.mark.parametrize(("kwargs", "field", "text"), [
    ({"on_decode_error": "ignore"}, "on_decode_error", "must be one of fail, skip, dead_letter"),
    ({"on_decode_error": "dead_letter"}, "dead_letter_topic", "is required by"),
    ({"dead_letter_topic": "dlq"}, "dead_letter_topic",
     "on_decode_error is 'fail' and on_process_error is 'fail'"),
    ({"on_process_error": "skip"}, "on_process_error", "must be one of fail, dead_letter"),
    ({"on_process_error": "dead_letter"}, "dead_letter_topic",
     "is required by on_process_error='dead_letter'"),
    ({"on_process_error": "dead_letter", "on_decode_error": "dead_letter"}, "dead_letter_topic",
     "is required by on_decode_error='dead_letter' and on_process_error='dead_letter'"),
    ({"dead_letter_max_per_turn": -1}, "dead_letter_max_per_turn", "must be an int >= 0"),
    ({"dead_letter_max_per_turn": True}, "dead_letter_max_per_turn", "got True"),
    ({"dead_letter_max_per_minute": 2.5}, "dead_letter_max_per_minute", "got 2.5"),
    ({"dead_letter_max_ratio": 0}, "dead_letter_max_ratio", "must be a number in (0, 1]"),
    ({"dead_letter_max_ratio": 1.5}, "dead_letter_max_ratio", "got 1.5"),
    ({"dead_letter_max_ratio": "half"}, "dead_letter_max_ratio", "got 'half'"),
    ({"on_decode_error": "dead_letter", "dead_letter_topic": "t"}, "dead_letter_topic",
     "'t' is an input topic"),
    ({"on_decode_error": "dead_letter", "dead_letter_topic": ""}, "dead_letter_topic",
     "must be a topic name"),
])
def test_config_refuses_a_policy_it_cannot_honour(kwargs: dict[str, object], field: str,
                                                  text: str) -> None:
    """Each inconsistent setting fails at construction, naming the field and why."""
    with pytest.raises(ConfigError) as info:
        config(**kwargs)
    assert info.value.field == field and text in str(info.value)


def test_one_dead_letter_topic_serves_both_policies_with_documented_limits() -> None:
    """on_process_error='dead_letter' alone, or with on_decode_error='dead_letter', is
    valid with one topic; the limits default to 100 per turn, 1000 per minute, no ratio,
    and None turns each off."""
    cfg = config(on_process_error="dead_letter", dead_letter_topic="dlq")
    assert (cfg.dead_letter_max_per_turn, cfg.dead_letter_max_per_minute,
            cfg.dead_letter_max_ratio) == (100, 1000, None)
    both = config(on_process_error="dead_letter", on_decode_error="dead_letter",
                  dead_letter_topic="dlq", dead_letter_max_per_turn=None,
                  dead_letter_max_per_minute=0, dead_letter_max_ratio=1)
    assert both.dead_letter_topic == "dlq" and both.dead_letter_max_per_turn is None
