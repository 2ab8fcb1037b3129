"""``on_process_error="dead_letter"`` on a real broker: poison messages among many reach
the dead-letter topic alone, the rest is processed and committed past them; a passed
limit stops the loop uncommitted; ``kasper dlq replay`` sends dead letters back."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Producer

from kasper_py import (
    Config,
    DeadLetterLimitError,
    Message,
    MessageProcessor,
    ProcessorContext,
    Sender,
    TopicProcessor,
)
from kasper_py.cli import main

pytestmark = pytest.mark.integration


class Forward(MessageProcessor):
    """Forwards every value to ``output``; a value starting with b"poison" raises."""

    def __init__(self, context: ProcessorContext, output: str) -> None:
        self.output = output

    def process(self, messages: list[Message], sender: Sender) -> None:
        for message in messages:
            if message.value.startswith(b"poison"):
                raise ValueError(f"cannot forward {message.value.decode()}")
            sender.send(self.output, message.value, key=message.key)


def produce(bootstrap: str, topic: str, count: int, poisoned: set[int]) -> None:
    """``count`` values to partition 0, ``poison-<n>`` at the offsets in ``poisoned``
    (with key and a header), ``v<n>`` elsewhere."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for n in range(count):
        while True:
            try:
                if n in poisoned:
                    producer.produce(topic, b"poison-%d" % n, key=b"key-%d" % n, partition=0,
                                     headers=[("trace", b"t-%d" % n)])
                else:
                    producer.produce(topic, b"v%d" % n, partition=0)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(60) == 0


def make_config(bootstrap: str, name: str, source: str, dead: str, **kwargs: Any) -> Config:
    return Config(name=name, bootstrap_servers=bootstrap, input_topics=[source],
                  batch_size=10_000, batch_wait=0.3, on_process_error="dead_letter",
                  dead_letter_topic=dead, **kwargs)


def run(cfg: Config, output: str) -> None:
    with TopicProcessor(cfg, lambda c: Forward(c, output)) as processor:
        processor.run_loop(until_caught_up=True)


def test_three_poison_messages_among_100k(bootstrap, new_topic, kafka, unique_name) -> None:
    """Exactly the 3 poison messages reach the dead-letter topic, with their key, value,
    header and the kasper.* headers; every other message's output is there once; the
    committed offset is past them all."""
    source, output, dead = new_topic("in"), new_topic("out"), new_topic("dlq")
    name = unique_name("poison-100k")
    poisoned = {17, 50_001, 99_999}
    produce(bootstrap, source, 100_000, poisoned)
    run(make_config(bootstrap, name, source, dead), output)
    letters = sorted(kafka.read_all(dead), key=lambda m: m.offset())
    assert [(m.key(), m.value()) for m in letters] == [
        (b"key-%d" % n, b"poison-%d" % n) for n in sorted(poisoned)]
    for letter, n in zip(letters, sorted(poisoned), strict=True):
        headers = dict(letter.headers())
        assert letter.headers()[0] == ("trace", b"t-%d" % n)
        assert headers["kasper.error"] == b"cannot forward poison-%d" % n
        assert headers["kasper.error.type"] == b"ValueError"
        assert headers["kasper.processor"] == name.encode()
        assert (headers["kasper.source.topic"], headers["kasper.source.partition"],
                headers["kasper.source.offset"]) == (source.encode(), b"0", b"%d" % n)
        assert int(headers["kasper.source.timestamp"]) > 0
    outputs = [m.value() for m in kafka.read_all(output)]
    assert len(outputs) == 100_000 - 3
    assert set(outputs) == {b"v%d" % n for n in range(100_000) if n not in poisoned}
    assert kafka.committed(name, source) == {0: 100_000}


def test_a_passed_limit_stops_uncommitted(bootstrap, new_topic, kafka, unique_name) -> None:
    """3 poison messages in one turn against dead_letter_max_per_turn=2: the loop stops
    with DeadLetterLimitError, nothing is committed, no output or dead letter is there."""
    source, output, dead = new_topic("in"), new_topic("out"), new_topic("dlq")
    name = unique_name("poison-limit")
    produce(bootstrap, source, 50, {3, 20, 40})
    with pytest.raises(DeadLetterLimitError, match=r"over dead_letter_max_per_turn=2"):
        run(make_config(bootstrap, name, source, dead, dead_letter_max_per_turn=2), output)
    assert kafka.committed(name, source) == {0: None}
    assert kafka.read_all(output) == [] and kafka.read_all(dead) == []


def test_dlq_replay_sends_dead_letters_back_once(bootstrap, new_topic, kafka, unique_name,  # noqa: PLR0917 - pytest fixtures
                                                 monkeypatch, capsys) -> None:
    """``kasper dlq replay`` appends each dead letter's key, value and own headers (no
    kasper.* header) to its source topic and partition; a dry run sends nothing, and a
    second replay resumes past what the first sent (nothing new to send)."""
    source, output, dead = new_topic("in"), new_topic("out"), new_topic("dlq")
    name = unique_name("poison-replay")
    produce(bootstrap, source, 6, {1, 4})
    run(make_config(bootstrap, name, source, dead), output)
    monkeypatch.setenv("KASPER_ON_PROCESS_ERROR", "dead_letter")
    monkeypatch.setenv("KASPER_DEAD_LETTER_TOPIC", dead)
    argv = ["dlq", "replay", "--name", name, "--bootstrap-servers", bootstrap,
            "--input-topics", source, "--log-level", "WARNING"]
    assert main([*argv, "--dry-run", "--error-type", "ValueError"]) == 0
    assert "would send 2 to " + source in capsys.readouterr().out
    assert len(kafka.read_all(source)) == 6
    assert main(argv) == 0
    assert f"sent 2 to {source}" in capsys.readouterr().out
    replayed = sorted(kafka.read_all(source), key=lambda m: m.offset())[6:]
    assert [(m.partition(), m.key(), m.value(), m.headers()) for m in replayed] == [
        (0, b"key-1", b"poison-1", [("trace", b"t-1")]),
        (0, b"key-4", b"poison-4", [("trace", b"t-4")])]
    assert main(argv) == 0
    assert f"{dead}: sent 0, 0 left out by the filters" in capsys.readouterr().out
    assert len(kafka.read_all(source)) == 8
