"""The decode-error policy on a real broker: undecodable input stops the loop
uncommitted by default, is skipped (and counted) or dead-lettered by choice, and a
dead-letter delivery that fails is not committed."""

from __future__ import annotations

from typing import Any

import pytest

from kasper_py import (
    Config,
    Message,
    MessageProcessor,
    ProcessorContext,
    ProduceError,
    Sender,
    SerdeError,
    TopicProcessor,
)
from kasper_py.observability.metrics import PrometheusObserver
from tests.kafka_clients import Producer

pytestmark = pytest.mark.integration

GOOD = [b'{"n": %d}' % i for i in range(6)]


class Double(MessageProcessor):
    """Sends 2*n for every JSON {"n": ...} to ``output``."""

    def __init__(self, context: ProcessorContext, output: str) -> None:
        self.output = output

    def process(self, messages: list[Message], sender: Sender) -> None:
        for message in messages:
            sender.send(self.output, {"n": message.value["n"] * 2}, key=message.key)


def produce_with_poison(bootstrap: str, topic: str, poison: bytes) -> None:
    """GOOD[0..2], then ``poison`` at offset 3 with key and headers, then GOOD[3..5]."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for value in GOOD[:3]:
        producer.produce(topic, value, partition=0)
    producer.produce(topic, poison, key=b"bad-key", partition=0, headers=[("trace", b"t-1")])
    for value in GOOD[3:]:
        producer.produce(topic, value, partition=0)
    assert producer.flush(30) == 0


def run(cfg: Config, output: str, observer: Any = None) -> None:
    with TopicProcessor(cfg, lambda c: Double(c, output), observer=observer) as processor:
        processor.run_loop(until_caught_up=True)


def make_config(bootstrap: str, name: str, source: str, **kwargs: Any) -> Config:
    return Config(name=name, bootstrap_servers=bootstrap, input_topics=[source],
                  value_serde="json", batch_size=100, batch_wait=0.3, **kwargs)


def test_default_policy_stops_uncommitted_naming_the_record(
        bootstrap, new_topic, kafka, unique_name) -> None:
    """By default the undecodable record fails the turn: SerdeError names topic,
    partition and offset, and nothing of that batch is committed."""
    source, output = new_topic("in"), new_topic("out")
    name = unique_name("dl-fail")
    produce_with_poison(bootstrap, source, b"{not json")
    with pytest.raises(SerdeError) as info:
        run(make_config(bootstrap, name, source), output)
    assert f"cannot decode {source}[0] offset 3: json serde: invalid JSON" in str(info.value)
    assert kafka.committed(name, source) == {0: None}
    assert kafka.read_all(output) == []


def test_skip_processes_the_rest_commits_past_and_counts(
        bootstrap, new_topic, kafka, unique_name) -> None:
    """skip: every good record has its output, the commit covers the bad one, and the
    skipped counter and the SerdeError counter say one."""
    source, output = new_topic("in"), new_topic("out")
    name = unique_name("dl-skip")
    produce_with_poison(bootstrap, source, b"\xff\xfe")
    cfg = make_config(bootstrap, name, source, on_decode_error="skip")
    observer = PrometheusObserver(cfg)
    run(cfg, output, observer)
    observer.close()
    assert sorted(m.value() for m in kafka.read_all(output)) == sorted(
        b'{"n":%d}' % (2 * i) for i in range(6))
    assert kafka.committed(name, source) == {0: 7}
    registry = observer.registry
    assert registry.get_sample_value("kasper_messages_skipped_total", {
        "processor": name, "topic": source, "partition": "0", "policy": "skip",
        "reason": "decode"}) == 1.0
    assert registry.get_sample_value("kasper_errors_total", {
        "processor": name, "type": "SerdeError"}) == 1.0
    assert registry.get_sample_value("kasper_messages_consumed_total", {
        "processor": name, "topic": source, "partition": "0"}) == 7.0


def test_dead_letter_topic_gets_the_original_record_with_its_error(
        bootstrap, new_topic, kafka, unique_name) -> None:
    """dead_letter: the bad record reaches the dead-letter topic with its key, value and
    headers unchanged plus the error and source coordinates; the rest is processed and
    the commit moves past it. A restart finds nothing left to do."""
    source, output, dead = new_topic("in"), new_topic("out"), new_topic("dlq")
    name = unique_name("dl-topic")
    produce_with_poison(bootstrap, source, b"{not json")
    cfg = make_config(bootstrap, name, source, on_decode_error="dead_letter",
                      dead_letter_topic=dead)
    run(cfg, output)
    assert len(kafka.read_all(output)) == 6
    (letter,) = kafka.read_all(dead)
    assert (letter.key(), letter.value()) == (b"bad-key", b"{not json")
    headers = dict(letter.headers())
    assert headers["trace"] == b"t-1"
    assert headers["kasper.error"].startswith(b"json serde: invalid JSON")
    assert (headers["kasper.source.topic"], headers["kasper.source.partition"],
            headers["kasper.source.offset"]) == (source.encode(), b"0", b"3")
    assert headers["kasper.processor"] == name.encode()
    assert kafka.committed(name, source) == {0: 7}
    run(cfg, output)
    assert len(kafka.read_all(dead)) == 1 and len(kafka.read_all(output)) == 6


def test_failed_dead_letter_delivery_is_not_committed(
        bootstrap, new_topic, kafka, unique_name) -> None:
    """A dead-letter message the broker refuses (over the topic's max.message.bytes)
    fails the turn with ProduceError: the batch, bad record included, stays uncommitted."""
    source, output = new_topic("in"), new_topic("out")
    dead = new_topic("dlq", **{"max.message.bytes": "1000"})
    name = unique_name("dl-refused")
    produce_with_poison(bootstrap, source, b"{" * 5000)
    cfg = make_config(bootstrap, name, source, on_decode_error="dead_letter",
                      dead_letter_topic=dead)
    with pytest.raises(ProduceError) as info:
        run(cfg, output)
    assert f"delivery to {dead}" in str(info.value)
    assert kafka.committed(name, source) == {0: None}
